//! The languages a context can run, their names on the wire (as the SDKs spell them),
//! the kernelspec each one runs on, and the small snippets of code the server sends
//! silently to a kernel to set environment variables.

use std::fmt;

use jupyter_protocol::connection_info::Transport;

use crate::error::RequestError;

/// A language a context runs. The wire names are E2B's: `python`, `javascript`,
/// `typescript`, `r`, `bash`, `java` (and the SDK's aliases `js`, `ts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    Python,
    JavaScript,
    TypeScript,
    R,
    Bash,
    Java,
}

impl Language {
    pub const ALL: [Language; 6] = [
        Language::Python,
        Language::JavaScript,
        Language::TypeScript,
        Language::R,
        Language::Bash,
        Language::Java,
    ];

    /// Parses a language as the SDKs send it: case-insensitive, surrounding blanks
    /// ignored, `js` and `ts` accepted for JavaScript and TypeScript.
    pub fn parse(name: &str) -> Result<Language, RequestError> {
        let normalized = name.trim().to_ascii_lowercase();
        let language = match normalized.as_str() {
            "python" => Language::Python,
            "javascript" | "js" => Language::JavaScript,
            "typescript" | "ts" => Language::TypeScript,
            "r" => Language::R,
            "bash" => Language::Bash,
            "java" => Language::Java,
            _ => {
                return Err(RequestError::UnknownLanguage {
                    language: name.to_string(),
                })
            }
        };
        Ok(language)
    }

    /// The name contexts report (`GET /contexts`, `POST /contexts`).
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::TypeScript => "typescript",
            Language::R => "r",
            Language::Bash => "bash",
            Language::Java => "java",
        }
    }

    /// The kernelspec (directory name under `<jupyter data dir>/kernels/`) the language
    /// runs on. JavaScript and TypeScript share Deno's kernel, which runs both.
    pub fn kernelspec_name(self) -> &'static str {
        match self {
            Language::Python => "python3",
            Language::JavaScript | Language::TypeScript => "deno",
            Language::R => "ir",
            Language::Bash => "bash",
            Language::Java => "java",
        }
    }

    /// How the server talks to the kernel: Unix sockets in the server's private runtime
    /// dir (no port races between kernels starting at once, nothing on the network),
    /// except for Java (JeroMQ has no IPC transport) and Deno (its kernel exits on an
    /// `ipc` connection file).
    pub fn transport(self) -> Transport {
        match self {
            Language::Java | Language::JavaScript | Language::TypeScript => Transport::TCP,
            _ => Transport::IPC,
        }
    }

    /// How long to keep listening after an execution is over by the protocol (idle and
    /// reply): Deno's kernel sometimes publishes a cell's `execute_result` right after
    /// its `idle` status. Other kernels keep the protocol's order.
    pub fn trailing_output_grace(self) -> std::time::Duration {
        match self {
            Language::JavaScript | Language::TypeScript => std::time::Duration::from_millis(50),
            _ => std::time::Duration::ZERO,
        }
    }

    /// Code that makes `cwd` the working directory, for kernels where starting the
    /// process in `cwd` is not enough (the JVM keeps `user.dir` as its own notion).
    pub fn cwd_code(self, cwd: &str) -> Option<String> {
        match self {
            Language::Java => Some(format!(
                "System.setProperty(\"user.dir\", {});",
                json_string(cwd)
            )),
            _ => None,
        }
    }

    /// Code that sets (`Some`) or removes (`None`) each variable in the kernel's process
    /// environment, so that the code run next and the processes it starts see them.
    /// Names must have been checked with [`check_env_name`]. Java cannot change its
    /// process environment; like E2B, it gets system properties instead.
    pub fn env_code(self, changes: &[(String, Option<String>)]) -> String {
        let mut code = String::new();
        for (name, value) in changes {
            let line = match (self, value) {
                (Language::Python, Some(value)) => format!(
                    "__import__('os').environ[{}] = {}",
                    json_string(name),
                    json_string(value)
                ),
                (Language::Python, None) => {
                    format!("__import__('os').environ.pop({}, None)", json_string(name))
                }
                (Language::JavaScript | Language::TypeScript, Some(value)) => format!(
                    "Deno.env.set({}, {});",
                    json_string(name),
                    json_string(value)
                ),
                (Language::JavaScript | Language::TypeScript, None) => {
                    format!("Deno.env.delete({});", json_string(name))
                }
                (Language::R, Some(value)) => {
                    format!("Sys.setenv({name} = {})", json_string(value))
                }
                (Language::R, None) => format!("Sys.unsetenv({})", json_string(name)),
                (Language::Bash, Some(value)) => format!("export {name}={}", shell_quote(value)),
                (Language::Bash, None) => format!("unset {name}"),
                (Language::Java, Some(value)) => format!(
                    "System.setProperty({}, {});",
                    json_string(name),
                    json_string(value)
                ),
                (Language::Java, None) => {
                    format!("System.clearProperty({});", json_string(name))
                }
            };
            code.push_str(&line);
            code.push('\n');
        }
        code
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Environment variable names go into code unquoted in R and bash, so only portable
/// names (`[A-Za-z_][A-Za-z0-9_]*`) are accepted.
pub fn check_env_name(name: &str) -> Result<(), RequestError> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if valid_start && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(RequestError::InvalidEnvName {
            name: name.to_string(),
        })
    }
}

/// Values are passed through string literals; a NUL byte cannot be in an environment
/// variable at all.
pub fn check_env_value(name: &str, value: &str) -> Result<(), RequestError> {
    if value.contains('\0') {
        return Err(RequestError::InvalidEnvValue {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// A JSON string literal, which is also a valid string literal in Python, JavaScript,
/// Java and R for any text without NUL (the escapes JSON uses — `\"`, `\\`, `\n`,
/// `\uXXXX` — mean the same in all of them).
fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// A single-quoted shell word: inside single quotes nothing is special except `'`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sdk_names_and_aliases() {
        assert_eq!(Language::parse("python").unwrap(), Language::Python);
        assert_eq!(Language::parse(" JS ").unwrap(), Language::JavaScript);
        assert_eq!(Language::parse("ts").unwrap(), Language::TypeScript);
        assert_eq!(Language::parse("TypeScript").unwrap(), Language::TypeScript);
        assert_eq!(Language::parse("R").unwrap(), Language::R);
        for language in Language::ALL {
            assert_eq!(Language::parse(language.name()).unwrap(), language);
        }
        let error = Language::parse("cobol").unwrap_err();
        assert!(error.to_string().contains("cobol"), "{error}");
    }

    #[test]
    fn env_names_are_checked() {
        assert!(check_env_name("FOO_1").is_ok());
        assert!(check_env_name("_x").is_ok());
        for bad in ["", "1A", "A-B", "A B", "A;rm", "é"] {
            assert!(check_env_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_env_value("A", "x\0y").is_err());
    }

    #[test]
    fn env_code_quotes_values() {
        let changes = vec![
            ("A".to_string(), Some("it's \"x\"\n".to_string())),
            ("B".to_string(), None),
        ];
        assert_eq!(
            Language::Python.env_code(&changes),
            "__import__('os').environ[\"A\"] = \"it's \\\"x\\\"\\n\"\n\
             __import__('os').environ.pop(\"B\", None)\n"
        );
        assert_eq!(
            Language::Bash.env_code(&changes),
            "export A='it'\\''s \"x\"\n'\nunset B\n"
        );
        assert_eq!(
            Language::R.env_code(&changes),
            "Sys.setenv(A = \"it's \\\"x\\\"\\n\")\nSys.unsetenv(\"B\")\n"
        );
        assert_eq!(
            Language::JavaScript.env_code(&changes),
            "Deno.env.set(\"A\", \"it's \\\"x\\\"\\n\");\nDeno.env.delete(\"B\");\n"
        );
    }
}
