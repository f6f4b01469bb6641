//! The host templates this berth builds itself (see `berth_server::HostTemplate`):
//!
//! - `code-interpreter-v1`, defined by `templates/code-interpreter-v1/` in the repository
//!   and compiled into this binary, or read from a directory of the same shape
//!   (`--code-interpreter-definition`: other pins, more packages). Its context (what its
//!   COPY steps read) is written under `<state>/host-templates/<name>/` at start:
//!   `setup/` holds the pins and scripts of the definition plus berth's IPython
//!   extension, `bin/berth-interpreter` the static berth-interpreter binary found beside
//!   this one (or given by flag).
//! - `mcp-gateway` (`templates/mcp-gateway/`): `base` plus the static `mcp-gateway`
//!   binary found beside this one (or given by flag) at `/usr/local/bin`, its context
//!   `bin/mcp-gateway`; its sandboxes get `MCP_GATEWAY_GIT_URL` (`--mcp-git-url`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use berth_build::{E2bBuildStart, Step};
use berth_server::{HostTemplate, SandboxResources};
use serde::Deserialize;

/// The name agents and the code-interpreter SDKs ask for.
pub const CODE_INTERPRETER: &str = "code-interpreter-v1";

const DEFINITION: &str = include_str!("../../../templates/code-interpreter-v1/template.json");

/// `setup/` of the code interpreter's context: (path, contents, mode).
const SETUP_FILES: &[(&str, &[u8], u32)] = &[
    (
        "apt-packages.txt",
        include_bytes!("../../../templates/code-interpreter-v1/apt-packages.txt"),
        0o644,
    ),
    (
        "requirements.txt",
        include_bytes!("../../../templates/code-interpreter-v1/requirements.txt"),
        0o644,
    ),
    (
        "install-kernels.sh",
        include_bytes!("../../../templates/code-interpreter-v1/install-kernels.sh"),
        0o755,
    ),
    (
        "js/package.json",
        include_bytes!("../../../templates/code-interpreter-v1/js/package.json"),
        0o644,
    ),
    (
        "js/package-lock.json",
        include_bytes!("../../../templates/code-interpreter-v1/js/package-lock.json"),
        0o644,
    ),
    (KERNEL_EXTENSION.0, KERNEL_EXTENSION.1, 0o644),
];

/// berth's IPython extension (charts, display data), part of every definition's setup.
const KERNEL_EXTENSION: (&str, &[u8]) = (
    "berth_kernel.py",
    include_bytes!("../../../crates/interpreter/python/berth_kernel.py"),
);

/// Copies the files and directories under `from` to `to`, with their permission bits
/// (symlinks and other special files are refused: a definition is plain files).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: not a plain file or directory", entry.path().display()),
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Definition {
    name: String,
    from_template: String,
    build_resources: Resources,
    resources: Resources,
    steps: Vec<Step>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Resources {
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
}

impl From<Resources> for SandboxResources {
    fn from(r: Resources) -> SandboxResources {
        SandboxResources {
            cpu_count: r.cpu_count,
            memory_mb: r.memory_mb,
            disk_size_mb: r.disk_size_mb,
        }
    }
}

/// The default berth-interpreter: beside this binary.
pub fn default_interpreter_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("berth-interpreter")))
        .unwrap_or_else(|| PathBuf::from("berth-interpreter"))
}

/// The name the SDKs create MCP gateway sandboxes from.
pub const MCP_GATEWAY: &str = "mcp-gateway";

const MCP_GATEWAY_DEFINITION: &str = include_str!("../../../templates/mcp-gateway/template.json");

/// The env var `mcp-gateway` reads its git base URL from (berth-mcp-gateway's
/// `GIT_URL_ENV`).
const MCP_GATEWAY_GIT_URL_ENV: &str = "MCP_GATEWAY_GIT_URL";

/// The default mcp-gateway binary: beside this binary.
pub fn default_mcp_gateway_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("mcp-gateway")))
        .unwrap_or_else(|| PathBuf::from("mcp-gateway"))
}

/// `mcp-gateway` with its context written under `state_dir` and `git_url` handed to its
/// sandboxes, or None (with a warning on stderr) when there is no mcp-gateway binary
/// to put in it.
pub fn mcp_gateway(state_dir: &Path, binary: &Path, git_url: &str) -> Result<Option<HostTemplate>> {
    if !binary.is_file() {
        eprintln!(
            "warning: {MCP_GATEWAY} is unavailable: no mcp-gateway at {} (build it with \
             crates/mcp-gateway/build-static.sh, put it beside berth or pass \
             --mcp-gateway-binary)",
            binary.display()
        );
        return Ok(None);
    }
    let definition: Definition = serde_json::from_str(MCP_GATEWAY_DEFINITION)
        .context("parsing the mcp-gateway definition")?;
    let context = state_dir.join("host-templates").join(&definition.name);
    write_binary_context(&context, "mcp-gateway", binary)
        .with_context(|| format!("writing {}", context.display()))?;
    let mut template = host_template(definition, context, None)?;
    template
        .sandbox_envs
        .insert(MCP_GATEWAY_GIT_URL_ENV.into(), git_url.to_string());
    Ok(Some(template))
}

/// Rewrites a context that holds one binary, `bin/<name>`.
fn write_binary_context(context: &Path, name: &str, binary: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if context.exists() {
        std::fs::remove_dir_all(context)?;
    }
    let target = context.join("bin").join(name);
    std::fs::create_dir_all(context.join("bin"))?;
    std::fs::copy(binary, &target)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
}

/// Checks an `--mcp-git-url`: an http(s) URL that repositories' `<owner>/<repo>` can be
/// appended to.
pub fn check_git_url(url: &str) -> Result<()> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest)
            if !rest.is_empty() && !rest.starts_with('/') && !url.contains(['?', '#', ' ']) =>
        {
            Ok(())
        }
        _ => bail!(
            "--mcp-git-url {url:?}: expected an http:// or https:// base URL such as \
             https://github.com (github/<owner>/<repo> is cloned from <url>/<owner>/<repo>)"
        ),
    }
}

/// Where the build's extra CA goes in the template (Debian's local CA directory).
const BUILD_CA_PATH: &str = "/usr/local/share/ca-certificates/berth-build-ca.crt";

/// Where `code-interpreter-v1` is defined.
pub enum DefinitionSource<'a> {
    /// The repository's `templates/code-interpreter-v1/`, compiled into this binary.
    Embedded,
    /// A directory of the same shape: `template.json` plus the files its COPY steps
    /// name under `setup/` (all of it is copied there). Without a berth-interpreter
    /// binary only a definition that does not COPY one builds.
    Directory(&'a Path),
}

/// `code-interpreter-v1` with its context written under `state_dir`, or None (with a
/// warning on stderr) when the embedded definition has no berth-interpreter binary to
/// put in it. `build_ca`: PEM roots the template trusts from its first TLS download on
/// (a TLS-intercepting proxy in front of the package registries).
pub fn code_interpreter(
    state_dir: &Path,
    source: DefinitionSource<'_>,
    interpreter: &Path,
    build_ca: Option<&Path>,
) -> Result<Option<HostTemplate>> {
    if let DefinitionSource::Directory(dir) = source {
        let path = dir.join("template.json");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!("reading the code-interpreter definition {}", path.display())
        })?;
        let definition: Definition = serde_json::from_str(&text).with_context(|| {
            format!("parsing the code-interpreter definition {}", path.display())
        })?;
        if definition.name != CODE_INTERPRETER {
            bail!(
                "{}: \"name\" is {:?}; a code-interpreter definition must name {CODE_INTERPRETER}",
                path.display(),
                definition.name
            );
        }
        let context = state_dir.join("host-templates").join(&definition.name);
        write_context(&context, Setup::Directory(dir), interpreter)
            .with_context(|| format!("writing {}", context.display()))?;
        return host_template(definition, context, build_ca).map(Some);
    }
    if !interpreter.is_file() {
        eprintln!(
            "warning: {CODE_INTERPRETER} is unavailable: no berth-interpreter at {} \
             (build it with crates/interpreter/build-static.sh, put it beside berth or pass \
             --interpreter-binary)",
            interpreter.display()
        );
        return Ok(None);
    }
    let definition: Definition =
        serde_json::from_str(DEFINITION).context("parsing the code-interpreter definition")?;
    let context = state_dir.join("host-templates").join(&definition.name);
    write_context(&context, Setup::Embedded, interpreter)
        .with_context(|| format!("writing {}", context.display()))?;
    host_template(definition, context, build_ca).map(Some)
}

/// The host template of `definition` whose context is `context`.
fn host_template(
    mut definition: Definition,
    context: PathBuf,
    build_ca: Option<&Path>,
) -> Result<HostTemplate> {
    if let Some(ca) = build_ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        std::fs::create_dir_all(context.join("ca"))?;
        std::fs::write(context.join("ca").join("build-ca.crt"), pem)?;
        // After the apt step (plain http, whose layer stays cached either way), before
        // anything that downloads over TLS.
        let at = definition
            .steps
            .iter()
            .position(|s| s.kind == "RUN")
            .map_or(0, |i| i + 1);
        definition.steps.splice(
            at..at,
            [
                Step::new("COPY", &["ca/build-ca.crt", BUILD_CA_PATH]),
                Step::new("RUN", &["update-ca-certificates"]),
            ],
        );
    }
    Ok(HostTemplate {
        name: definition.name,
        context,
        build: E2bBuildStart {
            from_image: None,
            from_template: Some(definition.from_template),
            from_image_registry: None,
            steps: definition.steps,
            start_cmd: definition.start_cmd,
            ready_cmd: definition.ready_cmd,
            force: None,
        },
        build_resources: definition.build_resources.into(),
        resources: definition.resources.into(),
        sandbox_envs: Default::default(),
    })
}

/// What `setup/` of the context is made of.
enum Setup<'a> {
    Embedded,
    /// A definition directory's files, with berth's IPython extension unless it has one.
    Directory(&'a Path),
}

/// Rewrites the context from scratch (files and modes are what the COPY hashes cover,
/// so an unchanged definition hashes the same and rebuilds from the step cache).
fn write_context(context: &Path, setup: Setup<'_>, interpreter: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if context.exists() {
        std::fs::remove_dir_all(context)?;
    }
    let write = |path: &Path, contents: &[u8], mode: u32| -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, contents)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    };
    match setup {
        Setup::Embedded => {
            for (path, contents, mode) in SETUP_FILES {
                write(&context.join("setup").join(path), contents, *mode)?;
            }
        }
        Setup::Directory(dir) => {
            copy_tree(dir, &context.join("setup"))?;
            let extension = context.join("setup").join(KERNEL_EXTENSION.0);
            if !extension.exists() {
                write(&extension, KERNEL_EXTENSION.1, 0o644)?;
            }
            if !interpreter.is_file() {
                return Ok(());
            }
        }
    }
    let binary = std::fs::read(interpreter)?;
    write(
        &context.join("bin").join("berth-interpreter"),
        &binary,
        0o755,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_parses_and_its_context_holds_every_copy_source() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("berth-interpreter");
        std::fs::write(&binary, b"#!/bin/sh\n").unwrap();
        let template = code_interpreter(dir.path(), DefinitionSource::Embedded, &binary, None)
            .unwrap()
            .unwrap();
        assert_eq!(template.name, CODE_INTERPRETER);
        assert_eq!(template.build.from_template.as_deref(), Some("base"));
        assert!(template.build.start_cmd.is_some() && template.build.ready_cmd.is_some());
        let copies: Vec<&Step> = template
            .build
            .steps
            .iter()
            .filter(|s| s.kind == "COPY")
            .collect();
        assert!(!copies.is_empty());
        for step in copies {
            let source = template.context.join(&step.args[0]);
            assert!(source.exists(), "{} is not in the context", step.args[0]);
        }
        assert!(code_interpreter(
            dir.path(),
            DefinitionSource::Embedded,
            &dir.path().join("missing"),
            None
        )
        .unwrap()
        .is_none());
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, b"-----BEGIN CERTIFICATE-----\n").unwrap();
        let with_ca = code_interpreter(dir.path(), DefinitionSource::Embedded, &binary, Some(&ca))
            .unwrap()
            .unwrap();
        assert_eq!(with_ca.build.steps.len(), template.build.steps.len() + 2);
        assert!(with_ca.context.join("ca/build-ca.crt").is_file());
    }

    #[test]
    fn the_mcp_gateway_template_copies_its_binary_and_hands_out_the_git_url() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("mcp-gateway");
        std::fs::write(&binary, b"#!/bin/sh\n").unwrap();
        let template = mcp_gateway(dir.path(), &binary, "http://git.test")
            .unwrap()
            .unwrap();
        assert_eq!(template.name, MCP_GATEWAY);
        assert_eq!(template.build.from_template.as_deref(), Some("base"));
        assert!(template.build.start_cmd.is_none());
        for step in template.build.steps.iter().filter(|s| s.kind == "COPY") {
            assert!(
                template.context.join(&step.args[0]).is_file(),
                "{:?}",
                step.args
            );
        }
        assert_eq!(
            template
                .sandbox_envs
                .get("MCP_GATEWAY_GIT_URL")
                .map(String::as_str),
            Some("http://git.test")
        );
        assert!(mcp_gateway(
            dir.path(),
            &dir.path().join("missing"),
            "https://github.com"
        )
        .unwrap()
        .is_none());
        for good in [
            "https://github.com",
            "http://198.18.0.1:8080/git/",
            "http://git.test",
        ] {
            assert!(check_git_url(good).is_ok(), "{good}");
        }
        for bad in [
            "github.com",
            "ftp://x",
            "https://",
            "https:///x",
            "http://x/?a=b",
            "file:///srv",
        ] {
            assert!(check_git_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_definition_directory_replaces_the_embedded_one() {
        let dir = tempfile::tempdir().unwrap();
        let definition = dir.path().join("definition");
        std::fs::create_dir_all(definition.join("extra")).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(DEFINITION).unwrap();
        json["steps"] = serde_json::json!([{ "type": "RUN", "args": ["echo v2"] }]);
        std::fs::write(definition.join("template.json"), json.to_string()).unwrap();
        std::fs::write(definition.join("extra/pins.txt"), "numpy==2\n").unwrap();
        let missing = dir.path().join("no-interpreter");
        let state = dir.path().join("state");
        let template = code_interpreter(
            &state,
            DefinitionSource::Directory(&definition),
            &missing,
            None,
        )
        .unwrap()
        .expect("a directory definition needs no interpreter binary");
        assert_eq!(template.build.steps, vec![Step::new("RUN", &["echo v2"])]);
        assert!(template.context.join("setup/extra/pins.txt").is_file());
        assert!(template.context.join("setup/berth_kernel.py").is_file());
        assert!(!template.context.join("bin/berth-interpreter").exists());

        json["name"] = "other".into();
        std::fs::write(definition.join("template.json"), json.to_string()).unwrap();
        let err = code_interpreter(
            &state,
            DefinitionSource::Directory(&definition),
            &missing,
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("must name code-interpreter-v1"),
            "{err:#}"
        );
        let err = code_interpreter(
            &state,
            DefinitionSource::Directory(&dir.path().join("none")),
            &missing,
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("reading the code-interpreter definition"),
            "{err:#}"
        );
    }
}
