//! The `--config` JSON the SDKs pass (`Sandbox.create(mcp={...})`, serialized as is):
//! one key per server. `github/<owner>/<repo>` keys are custom servers, an object with
//! the command that starts a stdio MCP server (`run_cmd`, or `runCmd` as the JS SDK's
//! users write it), an optional install command run first in the clone, and env vars.
//! Every other key names one of E2B's catalog servers (Docker images of the Docker MCP
//! Catalog), which berth cannot run: they are refused by name.

use std::collections::BTreeMap;

use crate::error::ConfigError;

/// A server the gateway starts from a git repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomServer {
    /// The config key, `github/<owner>/<repo>`: names the server in logs and errors.
    pub name: String,
    pub owner: String,
    pub repo: String,
    /// Shell command starting a stdio MCP server, run in the clone.
    pub run_cmd: String,
    /// Shell command run once in the clone before the server starts.
    pub install_cmd: Option<String>,
    /// Env vars of both commands, on top of the gateway's own.
    pub envs: BTreeMap<String, String>,
}

const GITHUB_PREFIX: &str = "github/";

/// Parses the config: every server, in key order, or the first problem found.
pub fn parse(text: &str) -> Result<Vec<CustomServer>, ConfigError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
    let serde_json::Value::Object(servers) = value else {
        return Err(ConfigError::NotAnObject);
    };
    let mut parsed = Vec::with_capacity(servers.len());
    for (key, body) in servers {
        let Some(path) = key.strip_prefix(GITHUB_PREFIX) else {
            return Err(ConfigError::CatalogServer { key });
        };
        let (owner, repo) = repository(&key, path)?;
        parsed.push(custom_server(&key, owner, repo, body)?);
    }
    Ok(parsed)
}

/// `<owner>/<repo>` of a `github/` key, each part a GitHub name (letters, digits, `-`,
/// `_`, `.`; not `.` or `..`), so the clone URL and directory cannot go elsewhere.
fn repository<'a>(key: &str, path: &'a str) -> Result<(&'a str, &'a str), ConfigError> {
    let valid = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match path.split_once('/') {
        Some((owner, repo)) if valid(owner) && valid(repo) => Ok((owner, repo)),
        _ => Err(ConfigError::BadRepository {
            key: key.to_string(),
        }),
    }
}

fn custom_server(
    key: &str,
    owner: &str,
    repo: &str,
    body: serde_json::Value,
) -> Result<CustomServer, ConfigError> {
    let serde_json::Value::Object(fields) = body else {
        return Err(ConfigError::NotAnObjectServer {
            key: key.to_string(),
        });
    };
    let mut server = CustomServer {
        name: key.to_string(),
        owner: owner.to_string(),
        repo: repo.to_string(),
        run_cmd: String::new(),
        install_cmd: None,
        envs: BTreeMap::new(),
    };
    let string = |field: &str, value: serde_json::Value| match value {
        serde_json::Value::String(text) => Ok(text),
        _ => Err(ConfigError::FieldType {
            key: key.to_string(),
            field: field.to_string(),
            expected: "a string",
        }),
    };
    for (field, value) in fields {
        match field.as_str() {
            "run_cmd" | "runCmd" => server.run_cmd = string(&field, value)?,
            "install_cmd" | "installCmd" => match value {
                serde_json::Value::Null => {}
                value => server.install_cmd = Some(string(&field, value)?),
            },
            "envs" => server.envs = envs(key, value)?,
            _ => {
                return Err(ConfigError::UnknownField {
                    key: key.to_string(),
                    field,
                })
            }
        }
    }
    if server.run_cmd.trim().is_empty() {
        return Err(ConfigError::MissingRunCmd {
            key: key.to_string(),
        });
    }
    if server
        .install_cmd
        .as_deref()
        .is_some_and(|cmd| cmd.trim().is_empty())
    {
        server.install_cmd = None;
    }
    Ok(server)
}

fn envs(key: &str, value: serde_json::Value) -> Result<BTreeMap<String, String>, ConfigError> {
    let wrong = || ConfigError::FieldType {
        key: key.to_string(),
        field: "envs".into(),
        expected: "an object of strings",
    };
    let serde_json::Value::Object(entries) = value else {
        return match value {
            serde_json::Value::Null => Ok(BTreeMap::new()),
            _ => Err(wrong()),
        };
    };
    entries
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(text)
                if !name.is_empty() && !name.contains('=') && !name.contains('\0') =>
            {
                Ok((name, text))
            }
            _ => Err(wrong()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_servers_in_either_sdk_spelling() {
        let servers = parse(
            r#"{
                "github/acme/echo": {"run_cmd": "python3 server.py", "install_cmd": "pip install .",
                                     "envs": {"GREETING": "hi"}},
                "github/acme/other.repo": {"runCmd": "node index.js", "installCmd": "npm install"}
            }"#,
        )
        .unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "github/acme/echo");
        assert_eq!((&*servers[0].owner, &*servers[0].repo), ("acme", "echo"));
        assert_eq!(servers[0].install_cmd.as_deref(), Some("pip install ."));
        assert_eq!(servers[0].envs["GREETING"], "hi");
        assert_eq!(servers[1].run_cmd, "node index.js");
        assert_eq!(servers[1].install_cmd.as_deref(), Some("npm install"));
        assert!(parse("{}").unwrap().is_empty());
    }

    #[test]
    fn catalog_servers_are_refused_by_name() {
        let err = parse(r#"{"airtable": {"airtableApiKey": "k"}}"#).unwrap_err();
        assert_eq!(
            err,
            ConfigError::CatalogServer {
                key: "airtable".into()
            }
        );
        assert!(err.to_string().contains("\"airtable\""), "{err}");
        assert!(err.to_string().contains("github/<owner>/<repo>"), "{err}");
    }

    #[test]
    fn bad_input_names_the_key_and_field() {
        let cases = [
            ("[]", "must be a JSON object"),
            ("not json", "not valid JSON"),
            (r#"{"github/acme": {"run_cmd": "x"}}"#, "github/acme"),
            (r#"{"github/../etc": {"run_cmd": "x"}}"#, "github/../etc"),
            (r#"{"github/a/b/c": {"run_cmd": "x"}}"#, "github/a/b/c"),
            (r#"{"github/a/b": "x"}"#, "must be an object"),
            (r#"{"github/a/b": {}}"#, "run_cmd"),
            (r#"{"github/a/b": {"run_cmd": " "}}"#, "run_cmd"),
            (
                r#"{"github/a/b": {"run_cmd": 3}}"#,
                "\"run_cmd\" must be a string",
            ),
            (
                r#"{"github/a/b": {"run_cmd": "x", "envs": {"A": 1}}}"#,
                "\"envs\" must be an object of strings",
            ),
            (
                r#"{"github/a/b": {"run_cmd": "x", "runcmd": "y"}}"#,
                "unknown field \"runcmd\"",
            ),
        ];
        for (config, expected) in cases {
            let err = parse(config).unwrap_err().to_string();
            assert!(err.contains(expected), "{config}: {err}");
        }
    }
}
