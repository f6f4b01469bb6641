//! What a build is asked to do: E2B's build-start body (`TemplateBuildStartV2`) and
//! the engine's own request.

use berth_oci::{Credentials, RegistryAuth};
use serde::{Deserialize, Serialize};

/// One step as the SDKs and the CLI send it: `{type, args, filesHash?, force?,
/// forceUpload?}`. Types: RUN, COPY (and ADD), ENV (and ARG), WORKDIR, USER; the SDK's
/// helpers (remove, rename, make_dir, make_symlink, pip/npm/apt installs, git clone)
/// all arrive as RUN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(rename = "filesHash", default, skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    #[serde(
        rename = "forceUpload",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub force_upload: Option<bool>,
}

impl Step {
    pub fn new(kind: &str, args: &[&str]) -> Step {
        Step {
            kind: kind.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            files_hash: None,
            force: None,
            force_upload: None,
        }
    }
}

/// `fromImageRegistry`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum E2bRegistry {
    Registry { username: String, password: String },
    Aws {},
    Gcp {},
}

/// The body of `POST /v2/templates/{templateID}/builds/{buildID}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bBuildStart {
    #[serde(default)]
    pub from_image: Option<String>,
    #[serde(default)]
    pub from_template: Option<String>,
    #[serde(default)]
    pub from_image_registry: Option<E2bRegistry>,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
    #[serde(default)]
    pub force: Option<bool>,
}

/// Where a build starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildBase {
    /// An OCI image reference, pulled with these credentials.
    Image {
        reference: String,
        auth: Option<RegistryAuth>,
    },
    /// An existing template of the store (e.g. `base`).
    Template(String),
}

/// A build to run.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The build's id (unique; names its logs and status).
    pub build_id: String,
    /// The store template the result is written as (manifest id).
    pub template_id: String,
    pub base: BuildBase,
    pub steps: Vec<Step>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// Ignore every cached step (E2B's build-level `force`).
    pub force: bool,
    /// Limits of the build sandboxes (the template's own).
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    /// Scope of the COPY uploads in the [`crate::FileStore`] (the team's id): files
    /// uploaded by one scope are invisible to builds of another.
    pub files_scope: String,
}

impl E2bBuildStart {
    /// The engine request for this body. `fromTemplate` wins when both are given.
    pub fn into_request(
        self,
        build_id: &str,
        template_id: &str,
        files_scope: &str,
        (cpu_count, memory_mb, disk_size_mb): (u32, u64, u64),
    ) -> BuildRequest {
        let base = match (self.from_template, self.from_image) {
            (Some(template), _) => BuildBase::Template(template),
            (None, Some(reference)) => BuildBase::Image {
                reference,
                auth: self.from_image_registry.map(|r| match r {
                    E2bRegistry::Registry { username, password } => {
                        RegistryAuth::Basic(Credentials { username, password })
                    }
                    E2bRegistry::Aws {} => RegistryAuth::Cloud { kind: "aws".into() },
                    E2bRegistry::Gcp {} => RegistryAuth::Cloud { kind: "gcp".into() },
                }),
            },
            // The SDKs' own default base.
            (None, None) => BuildBase::Template(berth_template::BASE_TEMPLATE_ID.into()),
        };
        BuildRequest {
            build_id: build_id.to_string(),
            template_id: template_id.to_string(),
            base,
            steps: self.steps,
            start_cmd: self.start_cmd.filter(|c| !c.is_empty()),
            ready_cmd: self.ready_cmd.filter(|c| !c.is_empty()),
            force: self.force.unwrap_or(false),
            cpu_count,
            memory_mb,
            disk_size_mb,
            files_scope: files_scope.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_bodies_parse() {
        // What `Template().from_image(...).copy(...).run_cmd(..., user="root")
        // .set_start_cmd(...)` serializes to in SDK 2.63.
        let body: E2bBuildStart = serde_json::from_str(
            r#"{"steps":[
                {"type":"COPY","args":["app","/app","","0755"],"force":false,"filesHash":"ab"},
                {"type":"RUN","args":["pip install x","root"],"force":true},
                {"type":"ENV","args":["A","1","B","2"],"force":false}],
              "force":false,"fromImage":"127.0.0.1:5000/x:1",
              "fromImageRegistry":{"type":"registry","username":"u","password":"p"},
              "startCmd":"python app.py","readyCmd":"sleep 1"}"#,
        )
        .unwrap();
        let request = body.into_request("b1", "t1", "team", (2, 512, 1024));
        assert_eq!(request.steps.len(), 3);
        assert_eq!(request.steps[0].files_hash.as_deref(), Some("ab"));
        assert_eq!(request.steps[1].force, Some(true));
        assert!(matches!(
            request.base,
            BuildBase::Image {
                auth: Some(RegistryAuth::Basic(_)),
                ..
            }
        ));
        assert_eq!(request.start_cmd.as_deref(), Some("python app.py"));

        let aws: E2bBuildStart = serde_json::from_str(
            r#"{"steps":[],"fromImage":"x","fromImageRegistry":{"type":"aws","awsAccessKeyId":"a","awsSecretAccessKey":"b","awsRegion":"c"}}"#,
        )
        .unwrap();
        assert!(matches!(
            aws.into_request("b", "t", "s", (1, 1, 1)).base,
            BuildBase::Image {
                auth: Some(RegistryAuth::Cloud { .. }),
                ..
            }
        ));
        let plain: E2bBuildStart =
            serde_json::from_str(r#"{"steps":[],"fromTemplate":"base"}"#).unwrap();
        assert_eq!(
            plain.into_request("b", "t", "s", (1, 1, 1)).base,
            BuildBase::Template("base".into())
        );
    }
}
