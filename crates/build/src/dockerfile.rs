//! Dockerfiles (single stage) → the step list the Python SDK's `from_dockerfile` makes:
//! `USER root` and `WORKDIR /` first; RUN (shell or exec form), COPY/ADD of local
//! files (`--chown`, `--chmod`; one step per source), ENV and ARG (as ENV, ARG without
//! default = ""), WORKDIR, USER; CMD/ENTRYPOINT combined by Docker's rules into the
//! start command with a 20 s ready wait; `USER user` / `WORKDIR /home/user` last unless
//! the Dockerfile set them. EXPOSE, VOLUME, LABEL, MAINTAINER are ignored. `$VAR` and
//! `${VAR}` of earlier ENV/ARG are expanded in FROM, COPY, ENV, WORKDIR and USER (RUN is
//! left to the shell); other references (`$PATH`) stay for the build to expand in the
//! step's environment. COPY steps carry no `filesHash`: the client computes it from its
//! build context and uploads the files.

use std::collections::BTreeMap;

use crate::error::BuildError;
use crate::executor::expand_known as expand;
use crate::request::Step;

/// What a Dockerfile converts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerfileTemplate {
    pub from_image: String,
    pub steps: Vec<Step>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// Instructions berth ignored, for the user.
    pub warnings: Vec<String>,
}

struct Instruction {
    line: usize,
    name: String,
    rest: String,
}

/// Parses `text` (a Dockerfile).
pub fn parse_dockerfile(text: &str) -> Result<DockerfileTemplate, BuildError> {
    let instructions = split_instructions(text);
    let err = |line: usize, message: String| BuildError::Dockerfile { line, message };
    let froms: Vec<&Instruction> = instructions.iter().filter(|i| i.name == "FROM").collect();
    if froms.len() > 1 {
        return Err(err(
            froms[1].line,
            "multi-stage Dockerfiles are not supported".into(),
        ));
    }
    let Some(from) = froms.first() else {
        return Err(err(1, "the Dockerfile has no FROM instruction".into()));
    };
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    // ARGs before FROM are visible in FROM.
    for instruction in instructions.iter().take_while(|i| i.name == "ARG") {
        for (k, v) in arg_pairs(&instruction.rest) {
            vars.insert(k, v);
        }
    }
    let from_words = words(&from.rest);
    let from_words: Vec<&String> = from_words.iter().filter(|w| !w.starts_with("--")).collect();
    let from_image = match from_words.len() {
        1 => expand(from_words[0], &vars),
        3 if from_words[1].eq_ignore_ascii_case("as") => expand(from_words[0], &vars),
        _ => {
            return Err(err(
                from.line,
                "FROM takes an image (and optionally AS name)".into(),
            ))
        }
    };
    let mut steps = vec![Step::new("USER", &["root"]), Step::new("WORKDIR", &["/"])];
    let mut warnings = Vec::new();
    let (mut user_set, mut workdir_set) = (false, false);
    let mut cmd: Option<(bool, Vec<String>)> = None;
    let mut entrypoint: Option<(bool, Vec<String>)> = None;
    for instruction in instructions.iter().skip_while(|i| i.name != "FROM").skip(1) {
        let line = instruction.line;
        let rest = instruction.rest.trim();
        match instruction.name.as_str() {
            "RUN" => {
                let (flags, rest) = take_flags(rest);
                if let Some(flag) = flags.first() {
                    warnings.push(format!("line {line}: RUN {flag} ignored"));
                }
                let command = match json_array(rest) {
                    Some(words) => shell_join(&words),
                    None => rest.to_string(),
                };
                if command.is_empty() {
                    return Err(err(line, "RUN needs a command".into()));
                }
                steps.push(Step::new("RUN", &[&command]));
            }
            "COPY" | "ADD" => {
                let (flags, rest) = take_flags(rest);
                let mut chown = String::new();
                let mut chmod = String::new();
                for flag in flags {
                    let (key, value) = flag.split_once('=').unwrap_or((flag.as_str(), ""));
                    match key {
                        "--chown" => chown = expand(value, &vars),
                        "--chmod" => {
                            let mode = expand(value, &vars);
                            let valid = (3..=4).contains(&mode.len())
                                && mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
                            if !valid {
                                return Err(err(
                                    line,
                                    format!(
                                        "invalid --chmod {value:?}: use an octal mode such as 0755"
                                    ),
                                ));
                            }
                            chmod = format!("{:04o}", u32::from_str_radix(&mode, 8).unwrap_or(0));
                        }
                        "--from" => {
                            return Err(err(
                                line,
                                "COPY --from needs a multi-stage build, which is not supported"
                                    .into(),
                            ))
                        }
                        other => warnings
                            .push(format!("line {line}: {} {other} ignored", instruction.name)),
                    }
                }
                let args = json_array(rest).unwrap_or_else(|| words(rest));
                if args.len() < 2 {
                    return Err(err(
                        line,
                        format!("{} needs a source and a destination", instruction.name),
                    ));
                }
                let dest = expand(&args[args.len() - 1], &vars);
                for src in &args[..args.len() - 1] {
                    let src = expand(src, &vars);
                    if instruction.name == "ADD" && src.contains("://") {
                        return Err(err(line, format!("ADD from a URL is not supported: {src}")));
                    }
                    steps.push(Step::new("COPY", &[&src, &dest, &chown, &chmod]));
                }
            }
            "ENV" => {
                let pairs = env_pairs(rest)
                    .ok_or_else(|| err(line, "ENV needs NAME=value pairs".into()))?;
                let mut args = Vec::new();
                for (k, v) in pairs {
                    let value = expand(&v, &vars);
                    vars.insert(k.clone(), value.clone());
                    args.push(k);
                    args.push(value);
                }
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                steps.push(Step::new("ENV", &refs));
            }
            "ARG" => {
                let mut args = Vec::new();
                for (k, v) in arg_pairs(rest) {
                    let value = expand(&v, &vars);
                    vars.insert(k.clone(), value.clone());
                    args.push(k);
                    args.push(value);
                }
                if !args.is_empty() {
                    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                    steps.push(Step::new("ENV", &refs));
                }
            }
            "WORKDIR" => {
                steps.push(Step::new("WORKDIR", &[&expand(rest, &vars)]));
                workdir_set = true;
            }
            "USER" => {
                steps.push(Step::new("USER", &[&expand(rest, &vars)]));
                user_set = true;
            }
            "CMD" => cmd = Some(command_form(rest)),
            "ENTRYPOINT" => entrypoint = Some(command_form(rest)),
            "EXPOSE" | "VOLUME" | "LABEL" | "MAINTAINER" => {}
            other => warnings.push(format!(
                "line {line}: unsupported instruction {other} ignored"
            )),
        }
    }
    let start_cmd = start_command(entrypoint, cmd).filter(|c| !c.trim().is_empty());
    if !user_set {
        steps.push(Step::new("USER", &["user"]));
    }
    if !workdir_set {
        steps.push(Step::new("WORKDIR", &["/home/user"]));
    }
    Ok(DockerfileTemplate {
        from_image,
        ready_cmd: start_cmd.as_ref().map(|_| "sleep 20".to_string()),
        start_cmd,
        steps,
        warnings,
    })
}

/// Docker's rules: exec-form ENTRYPOINT + CMD (a shell-form CMD as `/bin/sh -c`),
/// shell-form ENTRYPOINT alone, else CMD.
fn start_command(
    entrypoint: Option<(bool, Vec<String>)>,
    cmd: Option<(bool, Vec<String>)>,
) -> Option<String> {
    match (entrypoint, cmd) {
        (Some((true, mut words)), cmd) => {
            match cmd {
                Some((true, args)) => words.extend(args),
                Some((false, args)) if !args.is_empty() => {
                    words.extend(["/bin/sh".to_string(), "-c".to_string(), args[0].clone()])
                }
                _ => {}
            }
            (!words.is_empty()).then(|| shell_join(&words))
        }
        (Some((false, words)), _) => words.first().cloned(),
        (None, Some((true, words))) => (!words.is_empty()).then(|| shell_join(&words)),
        (None, Some((false, words))) => words.first().cloned(),
        (None, None) => None,
    }
}

/// (exec form?, words): exec form is a JSON array; shell form is one string.
fn command_form(rest: &str) -> (bool, Vec<String>) {
    match json_array(rest) {
        Some(words) => (true, words),
        None => (false, vec![rest.to_string()]),
    }
}

fn json_array(text: &str) -> Option<Vec<String>> {
    let text = text.trim();
    text.starts_with('[')
        .then(|| serde_json::from_str::<Vec<String>>(text).ok())
        .flatten()
}

/// Python's `shlex.quote` of each word, joined with spaces.
fn shell_join(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            let safe = !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b));
            if safe {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\"'\"'"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Leading `--flag[=value]` words and the rest of the line.
fn take_flags(rest: &str) -> (Vec<String>, &str) {
    let mut flags = Vec::new();
    let mut rest = rest.trim_start();
    while rest.starts_with("--") {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        flags.push(rest[..end].to_string());
        rest = rest[end..].trim_start();
    }
    (flags, rest)
}

/// Whitespace-separated words; double and single quotes group, backslash escapes.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => current.push(c),
            (_, '\\') => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
                in_word = true;
            }
            (_, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(current);
    }
    out
}

/// `ENV a=1 b="x y"` or the legacy `ENV name value with spaces`.
fn env_pairs(rest: &str) -> Option<Vec<(String, String)>> {
    let list = words(rest);
    let first = list.first()?;
    if !first.contains('=') {
        let (name, value) = rest.trim().split_once(char::is_whitespace)?;
        return Some(vec![(name.to_string(), words(value.trim()).join(" "))]);
    }
    list.into_iter()
        .map(|w| {
            w.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn arg_pairs(rest: &str) -> Vec<(String, String)> {
    words(rest)
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (w, String::new()),
        })
        .collect()
}

/// Logical instructions: comments and blank lines dropped, `\` continuations joined,
/// instruction names upper-cased.
fn split_instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let trimmed = line.trim_start();
        if pending.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if pending.is_some() && trimmed.starts_with('#') {
            continue;
        }
        let (start, mut text) = pending.take().unwrap_or((index + 1, String::new()));
        if let Some(body) = line.strip_suffix('\\') {
            text.push_str(body);
            text.push(' ');
            pending = Some((start, text));
            continue;
        }
        text.push_str(line);
        let text = text.trim();
        let (name, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        out.push(Instruction {
            line: start,
            name: name.to_ascii_uppercase(),
            rest: rest.trim().to_string(),
        });
    }
    if let Some((start, text)) = pending {
        let text = text.trim().to_string();
        let (name, rest) = text.split_once(char::is_whitespace).unwrap_or((&text, ""));
        out.push(Instruction {
            line: start,
            name: name.to_ascii_uppercase(),
            rest: rest.trim().to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(t: &DockerfileTemplate) -> Vec<(String, Vec<String>)> {
        t.steps
            .iter()
            .map(|s| (s.kind.clone(), s.args.clone()))
            .collect()
    }

    fn step(kind: &str, args: &[&str]) -> (String, Vec<String>) {
        (
            kind.to_string(),
            args.iter().map(|a| a.to_string()).collect(),
        )
    }

    #[test]
    fn a_dockerfile_becomes_the_sdk_step_list() {
        let t = parse_dockerfile(
            "ARG BASE=debian:bookworm\nFROM ${BASE}\n# comment\nENV APP=/srv/app PORT=8000\n\
             RUN apt-get update && \\\n    apt-get install -y curl\n\
             COPY --chown=user:user --chmod=755 run.sh lib/ $APP/\n\
             WORKDIR $APP\nEXPOSE 8000\nARG MODE\n\
             ENTRYPOINT [\"python3\", \"-m\"]\nCMD [\"http.server\", \"$PORT\"]\n",
        )
        .unwrap();
        assert_eq!(t.from_image, "debian:bookworm");
        assert_eq!(
            kinds(&t),
            vec![
                step("USER", &["root"]),
                step("WORKDIR", &["/"]),
                step("ENV", &["APP", "/srv/app", "PORT", "8000"]),
                step("RUN", &["apt-get update &&      apt-get install -y curl"]),
                step("COPY", &["run.sh", "/srv/app/", "user:user", "0755"]),
                step("COPY", &["lib/", "/srv/app/", "user:user", "0755"]),
                step("WORKDIR", &["/srv/app"]),
                step("ENV", &["MODE", ""]),
                step("USER", &["user"]),
            ]
        );
        assert_eq!(
            t.start_cmd.as_deref(),
            Some("python3 -m http.server '$PORT'")
        );
        assert_eq!(t.ready_cmd.as_deref(), Some("sleep 20"));
    }

    #[test]
    fn start_commands_follow_docker_rules() {
        let shell_cmd = parse_dockerfile("FROM x\nCMD python app.py\n").unwrap();
        assert_eq!(shell_cmd.start_cmd.as_deref(), Some("python app.py"));
        let exec_entry_shell_cmd =
            parse_dockerfile("FROM x\nENTRYPOINT [\"tini\"]\nCMD run it\n").unwrap();
        assert_eq!(
            exec_entry_shell_cmd.start_cmd.as_deref(),
            Some("tini /bin/sh -c 'run it'")
        );
        let shell_entry =
            parse_dockerfile("FROM x\nENTRYPOINT serve --fast\nCMD [\"ignored\"]\n").unwrap();
        assert_eq!(shell_entry.start_cmd.as_deref(), Some("serve --fast"));
        let none = parse_dockerfile("FROM x\nUSER app\nWORKDIR /w\n").unwrap();
        assert_eq!(none.start_cmd, None);
        assert_eq!(none.steps.last().unwrap().kind, "WORKDIR");
        assert_eq!(none.steps.len(), 4, "no default USER/WORKDIR appended");
    }

    #[test]
    fn unsupported_dockerfiles_are_refused_with_the_line() {
        let multi = parse_dockerfile("FROM a AS build\nRUN make\nFROM b\n").unwrap_err();
        assert!(
            matches!(multi, BuildError::Dockerfile { line: 3, .. }),
            "{multi}"
        );
        let from = parse_dockerfile("FROM a\nCOPY --from=build /x /y\n").unwrap_err();
        assert!(matches!(from, BuildError::Dockerfile { line: 2, .. }));
        assert!(parse_dockerfile("RUN true\n").is_err());
        assert!(parse_dockerfile("FROM a\nADD https://x.example/f /f\n").is_err());
        let path = parse_dockerfile("FROM a\nENV PATH=/opt/bin:$PATH\n").unwrap();
        assert_eq!(path.steps[2].args, vec!["PATH", "/opt/bin:$PATH"]);
        let legacy = parse_dockerfile("FROM a\nENV GREETING hello world\n").unwrap();
        assert_eq!(legacy.steps[2].args, vec!["GREETING", "hello world"]);
    }
}
