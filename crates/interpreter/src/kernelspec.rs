//! Finding kernelspecs (`<data dir>/kernels/<name>/kernel.json`) in the Jupyter data
//! directories the server is given, and turning one into a command line.

use std::path::{Path, PathBuf};

use jupyter_protocol::JupyterKernelspec;

use crate::error::KernelError;
use crate::language::Language;

/// How a kernel wants to be interrupted (`interrupt_mode` in kernel.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptMode {
    /// SIGINT to the kernel's process group (the default).
    Signal,
    /// An `interrupt_request` on the control channel.
    Message,
}

/// One kernelspec found on disk.
#[derive(Debug, Clone)]
pub struct Kernelspec {
    pub name: String,
    /// The directory holding kernel.json (`{resource_dir}` in argv).
    pub resource_dir: PathBuf,
    pub spec: JupyterKernelspec,
}

impl Kernelspec {
    /// The kernel's argv with `{connection_file}` and `{resource_dir}` substituted.
    pub fn argv(&self, connection_file: &Path) -> Result<Vec<String>, KernelError> {
        if self.spec.argv.is_empty() {
            return Err(KernelError::BadKernelspec {
                path: self.resource_dir.join("kernel.json"),
                detail: "argv is empty".into(),
            });
        }
        let connection_file = connection_file.to_string_lossy();
        let resource_dir = self.resource_dir.to_string_lossy();
        Ok(self
            .spec
            .argv
            .iter()
            .map(|arg| {
                arg.replace("{connection_file}", &connection_file)
                    .replace("{resource_dir}", &resource_dir)
            })
            .collect())
    }

    pub fn interrupt_mode(&self) -> InterruptMode {
        match self.spec.interrupt_mode.as_deref() {
            Some("message") => InterruptMode::Message,
            _ => InterruptMode::Signal,
        }
    }
}

/// The Jupyter data directories searched for kernelspecs, first match wins.
#[derive(Debug, Clone)]
pub struct KernelspecCatalog {
    data_dirs: Vec<PathBuf>,
}

impl KernelspecCatalog {
    /// `extra` first (the template's own prefix), then Jupyter's standard data
    /// directories (`$JUPYTER_PATH`, the user's, `/usr/local/share/jupyter`,
    /// `/usr/share/jupyter`, where Debian's IRkernel puts its spec).
    /// Only the given directories (tests, or a template that wants no stray kernels).
    pub fn only(dirs: Vec<PathBuf>) -> KernelspecCatalog {
        KernelspecCatalog {
            data_dirs: dirs
                .into_iter()
                .map(|dir| std::path::absolute(&dir).unwrap_or(dir))
                .collect(),
        }
    }

    pub fn new(extra: Vec<PathBuf>) -> KernelspecCatalog {
        // Absolute, so `{resource_dir}` means the same from any kernel's cwd.
        let mut data_dirs: Vec<PathBuf> = extra
            .into_iter()
            .map(|dir| std::path::absolute(&dir).unwrap_or(dir))
            .collect();
        for dir in jupyter_zmq_client::data_dirs() {
            if !data_dirs.contains(&dir) {
                data_dirs.push(dir);
            }
        }
        KernelspecCatalog { data_dirs }
    }

    pub fn find(&self, language: Language) -> Result<Kernelspec, KernelError> {
        let name = language.kernelspec_name();
        for dir in &self.data_dirs {
            let resource_dir = dir.join("kernels").join(name);
            let path = resource_dir.join("kernel.json");
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(KernelError::BadKernelspec {
                        path,
                        detail: error.to_string(),
                    })
                }
            };
            let spec: JupyterKernelspec =
                serde_json::from_str(&text).map_err(|error| KernelError::BadKernelspec {
                    path: path.clone(),
                    detail: error.to_string(),
                })?;
            return Ok(Kernelspec {
                name: name.to_string(),
                resource_dir,
                spec,
            });
        }
        Err(KernelError::NotInstalled {
            language: language.name(),
            kernelspec: name,
            searched: self.data_dirs.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_first_kernelspec_and_substitutes_argv() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        for (dir, marker) in [(&first, "first"), (&second, "second")] {
            let spec_dir = dir.path().join("kernels/bash");
            std::fs::create_dir_all(&spec_dir).unwrap();
            std::fs::write(
                spec_dir.join("kernel.json"),
                format!(
                    r#"{{"argv":["run","{marker}","{{resource_dir}}/x","-f","{{connection_file}}"],
                       "display_name":"Bash","language":"bash","interrupt_mode":"message"}}"#
                ),
            )
            .unwrap();
        }
        let catalog =
            KernelspecCatalog::new(vec![first.path().to_owned(), second.path().to_owned()]);
        let spec = catalog.find(Language::Bash).unwrap();
        let argv = spec.argv(Path::new("/run/conn.json")).unwrap();
        let resource_dir = first.path().join("kernels/bash");
        assert_eq!(
            argv,
            vec![
                "run".to_string(),
                "first".to_string(),
                format!("{}/x", resource_dir.display()),
                "-f".to_string(),
                "/run/conn.json".to_string(),
            ]
        );
        assert_eq!(spec.interrupt_mode(), InterruptMode::Message);
    }

    #[test]
    fn missing_kernelspec_names_the_language() {
        let empty = tempfile::tempdir().unwrap();
        let catalog = KernelspecCatalog {
            data_dirs: vec![empty.path().to_owned()],
        };
        let error = catalog.find(Language::Java).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("language java is not installed"),
            "{message}"
        );
    }
}
