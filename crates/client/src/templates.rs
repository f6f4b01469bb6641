//! Template calls: build requests, COPY uploads, starting and following a build, tags,
//! listings and deletion.

use std::path::Path;
use std::time::Duration;

use berth_api::{
    AssignTemplateTagsRequest, AssignedTemplateTags, DeleteTemplateTagsRequest, Template,
    TemplateBuildFileUpload, TemplateBuildInfo, TemplateBuildRequestV3, TemplateBuildStartV2,
    TemplateRequestResponseV3, TemplateTag, TemplateWithBuilds,
};
use reqwest::Method;

use crate::api::{encode_segment, next_token_of, ApiClient, Page};
use crate::error::ClientError;

/// Longest an upload of build files may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

fn template_path(template: &str, suffix: &str) -> String {
    format!("/templates/{}{suffix}", encode_segment(template))
}

impl ApiClient {
    /// `POST /v3/templates`: registers a build of template `name[:tag]`.
    pub async fn request_template_build(
        &self,
        request: &TemplateBuildRequestV3,
    ) -> Result<TemplateRequestResponseV3, ClientError> {
        self.call(
            "POST /v3/templates",
            Method::POST,
            "/v3/templates",
            Some(request),
        )
        .await
    }

    /// `GET /templates/{id}/files/{hash}`: is the upload for `hash` present, and where
    /// to put it.
    pub async fn template_file_upload_link(
        &self,
        template_id: &str,
        files_hash: &str,
    ) -> Result<TemplateBuildFileUpload, ClientError> {
        self.call::<(), _>(
            "GET /templates/{id}/files/{hash}",
            Method::GET,
            &template_path(
                template_id,
                &format!("/files/{}", encode_segment(files_hash)),
            ),
            None,
        )
        .await
    }

    /// `PUT`s the file at `archive` (a tar or tar.gz) to an upload URL, with its length
    /// (presigned URLs refuse chunked bodies). The URL carries its own authorisation;
    /// the API key is not sent.
    pub async fn upload_template_files(
        &self,
        url: &str,
        archive: &Path,
    ) -> Result<(), ClientError> {
        let file_error = |source| ClientError::File {
            path: archive.to_path_buf(),
            source,
        };
        let file = tokio::fs::File::open(archive).await.map_err(file_error)?;
        let length = file.metadata().await.map_err(file_error)?.len();
        let response = self
            .http()
            .put(url)
            .header(reqwest::header::CONTENT_LENGTH, length)
            .body(reqwest::Body::wrap_stream(
                tokio_util::io::ReaderStream::new(file),
            ))
            .timeout(UPLOAD_TIMEOUT)
            .send()
            .await
            .map_err(ClientError::transport)?;
        if !response.status().is_success() {
            return Err(ClientError::from_response(response).await);
        }
        response.bytes().await.map_err(ClientError::transport)?;
        Ok(())
    }

    /// `POST /v2/templates/{id}/builds/{buildID}`: starts a registered build.
    pub async fn start_template_build(
        &self,
        template_id: &str,
        build_id: &str,
        body: &TemplateBuildStartV2,
    ) -> Result<(), ClientError> {
        self.call_without_answer(
            Method::POST,
            &format!(
                "/v2/templates/{}/builds/{}",
                encode_segment(template_id),
                encode_segment(build_id)
            ),
            Some(body),
        )
        .await
    }

    /// `GET /templates/{id}/builds/{buildID}/status` with log entries from
    /// `logs_offset`.
    pub async fn template_build_status(
        &self,
        template_id: &str,
        build_id: &str,
        logs_offset: usize,
    ) -> Result<TemplateBuildInfo, ClientError> {
        let response = self
            .send::<()>(
                Method::GET,
                &template_path(
                    template_id,
                    &format!("/builds/{}/status", encode_segment(build_id)),
                ),
                &[("logsOffset".to_owned(), logs_offset.to_string())],
                None,
            )
            .await?;
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            what: "GET /templates/{id}/builds/{buildID}/status",
            source,
        })
    }

    /// `DELETE /templates/{id}/builds/{buildID}` (berth): cancels a running build.
    pub async fn cancel_template_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<(), ClientError> {
        self.call_without_answer::<()>(
            Method::DELETE,
            &template_path(
                template_id,
                &format!("/builds/{}", encode_segment(build_id)),
            ),
            None,
        )
        .await
    }

    /// `GET /v2/templates`: one page of the templates the key's team sees.
    pub async fn list_templates(
        &self,
        limit: Option<u32>,
        next_token: Option<&str>,
    ) -> Result<Page<Template>, ClientError> {
        let mut query = Vec::new();
        if let Some(limit) = limit {
            query.push(("limit".to_owned(), limit.to_string()));
        }
        if let Some(token) = next_token {
            query.push(("nextToken".to_owned(), token.to_owned()));
        }
        let response = self
            .send::<()>(Method::GET, "/v2/templates", &query, None)
            .await?;
        let next_token = next_token_of(&response);
        let bytes = response.bytes().await.map_err(ClientError::transport)?;
        let items = serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            what: "GET /v2/templates",
            source,
        })?;
        Ok(Page { items, next_token })
    }

    /// `GET /templates/{id}`: a template (by id or name) with its newest builds.
    pub async fn get_template(&self, template: &str) -> Result<TemplateWithBuilds, ClientError> {
        self.call::<(), _>(
            "GET /templates/{id}",
            Method::GET,
            &template_path(template, ""),
            None,
        )
        .await
    }

    /// `DELETE /templates/{id}` (by id or name).
    pub async fn delete_template(&self, template: &str) -> Result<(), ClientError> {
        self.call_without_answer::<()>(Method::DELETE, &template_path(template, ""), None)
            .await
    }

    /// `POST /templates/tags`.
    pub async fn assign_template_tags(
        &self,
        target: &str,
        tags: &[String],
    ) -> Result<AssignedTemplateTags, ClientError> {
        let body = AssignTemplateTagsRequest {
            target: target.to_owned(),
            tags: tags.to_vec(),
        };
        self.call(
            "POST /templates/tags",
            Method::POST,
            "/templates/tags",
            Some(&body),
        )
        .await
    }

    /// `DELETE /templates/tags`.
    pub async fn delete_template_tags(
        &self,
        name: &str,
        tags: &[String],
    ) -> Result<(), ClientError> {
        let body = DeleteTemplateTagsRequest {
            name: name.to_owned(),
            tags: tags.to_vec(),
        };
        self.call_without_answer(Method::DELETE, "/templates/tags", Some(&body))
            .await
    }

    /// `GET /templates/{id}/tags`.
    pub async fn template_tags(&self, template: &str) -> Result<Vec<TemplateTag>, ClientError> {
        self.call::<(), _>(
            "GET /templates/{id}/tags",
            Method::GET,
            &template_path(template, "/tags"),
            None,
        )
        .await
    }
}
