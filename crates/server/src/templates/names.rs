//! Template names as E2B validates them: `[namespace/]alias[:tag]`, trimmed and
//! lowercased; aliases and namespaces of `[a-z0-9_-]`, tags of `[a-z0-9_.-]` and never a
//! UUID; the tag `default` is what a bare name means. A team's namespace is its slug.

use berth_store::DEFAULT_TAG;

/// Longest alias E2B accepts.
pub const MAX_NAME_LEN: usize = 128;

/// Why a name or tag is refused (the 400's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("invalid template name \"{0}\": use lowercase letters, numbers, dashes and underscores, at most {MAX_NAME_LEN} characters")]
    Alias(String),
    #[error("invalid namespace \"{0}\": use lowercase letters, numbers, dashes and underscores")]
    Namespace(String),
    #[error("invalid tag \"{0}\": use lowercase letters, numbers, dots, dashes and underscores")]
    Tag(String),
    #[error("invalid tag \"{0}\": a tag cannot be a UUID")]
    UuidTag(String),
    #[error("namespace \"{namespace}\" must match your team \"{team}\"")]
    ForeignNamespace { namespace: String, team: String },
}

/// A parsed `[namespace/]alias[:tag]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateName {
    pub namespace: Option<String>,
    pub alias: String,
    /// None: no tag given, or `default`.
    pub tag: Option<String>,
}

impl TemplateName {
    /// The tag this name points at (`default` when none was given).
    pub fn tag_or_default(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }

    /// Refuses a namespace other than `team_slug` (names a team creates or changes).
    pub fn require_namespace(&self, team_slug: &str) -> Result<(), NameError> {
        match &self.namespace {
            Some(namespace) if namespace != team_slug => Err(NameError::ForeignNamespace {
                namespace: namespace.clone(),
                team: team_slug.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

fn clean(value: &str) -> String {
    value.trim().to_ascii_lowercase()
}

fn is_identifier(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// `[namespace/]alias[:tag]`, cleaned and validated.
pub fn parse_name(input: &str) -> Result<TemplateName, NameError> {
    let input = input.trim();
    let (identifier, tag) = match input.split_once(':') {
        Some((identifier, tag)) => (identifier, Some(tag)),
        None => (input, None),
    };
    let (namespace, alias) = match identifier.split_once('/') {
        Some((namespace, alias)) => (Some(namespace), alias),
        None => (None, identifier),
    };
    let tag = match tag {
        Some(tag) => {
            let cleaned = clean(tag);
            if !is_tag(&cleaned) {
                return Err(NameError::Tag(tag.to_string()));
            }
            (cleaned != DEFAULT_TAG).then_some(cleaned)
        }
        None => None,
    };
    let namespace = match namespace {
        Some(namespace) => {
            let cleaned = clean(namespace);
            if !is_identifier(&cleaned) {
                return Err(NameError::Namespace(namespace.to_string()));
            }
            Some(cleaned)
        }
        None => None,
    };
    let cleaned = clean(alias);
    if !is_identifier(&cleaned) || cleaned.len() > MAX_NAME_LEN {
        return Err(NameError::Alias(alias.to_string()));
    }
    Ok(TemplateName {
        namespace,
        alias: cleaned,
        tag,
    })
}

fn is_tag(value: &str) -> bool {
    !value.is_empty()
        && value.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

/// Tags cleaned, validated and deduplicated (order kept).
pub fn validate_tags<'a>(
    tags: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<String>, NameError> {
    let mut out: Vec<String> = Vec::new();
    for tag in tags {
        let cleaned = clean(tag);
        if !is_tag(&cleaned) {
            return Err(NameError::Tag(tag.to_string()));
        }
        if uuid::Uuid::parse_str(&cleaned).is_ok() {
            return Err(NameError::UuidTag(tag.to_string()));
        }
        if !out.contains(&cleaned) {
            out.push(cleaned);
        }
    }
    Ok(out)
}

/// A team's namespace: its name, lowercased, with every character outside
/// `[a-z0-9_-]` replaced by `-`.
pub fn team_slug(team_name: &str) -> String {
    let slug: String = team_name
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if slug.is_empty() {
        "team".into()
    } else {
        slug
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_like_e2b() {
        assert_eq!(
            parse_name(" My-App_2 ").unwrap(),
            TemplateName {
                namespace: None,
                alias: "my-app_2".into(),
                tag: None
            }
        );
        let tagged = parse_name("team/app:V1.2").unwrap();
        assert_eq!(tagged.namespace.as_deref(), Some("team"));
        assert_eq!(tagged.tag.as_deref(), Some("v1.2"));
        assert_eq!(parse_name("app:default").unwrap().tag, None);
        assert_eq!(parse_name("app").unwrap().tag_or_default(), "default");
        for bad in [
            "",
            "a b",
            "app.x",
            "app:",
            "app:a b",
            "/app",
            "x/a.b",
            &"a".repeat(129),
        ] {
            assert!(parse_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tags_are_deduplicated_and_never_uuids() {
        assert_eq!(
            validate_tags(["V1", "v1", "stable", "1.0"]).unwrap(),
            ["v1", "stable", "1.0"]
        );
        assert!(matches!(
            validate_tags(["0b5d0e6a-1c2b-4a8e-9f3d-2a1b3c4d5e6f"]),
            Err(NameError::UuidTag(_))
        ));
        assert!(validate_tags(["a/b"]).is_err());
    }

    #[test]
    fn namespaces_must_be_the_callers() {
        let name = parse_name("other/app").unwrap();
        assert!(name.require_namespace("mine").is_err());
        assert!(name.require_namespace("other").is_ok());
        assert!(parse_name("app").unwrap().require_namespace("mine").is_ok());
        assert_eq!(team_slug("Default"), "default");
        assert_eq!(team_slug("ACME Inc."), "acme-inc-");
    }
}
