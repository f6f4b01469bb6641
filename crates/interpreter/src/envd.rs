//! The sandbox's own environment variables, asked from envd (`GET /envs`).
//!
//! The server and its kernels start when the template is built and come back from a
//! memory checkpoint, so they never see the variables a sandbox is created with; envd
//! holds those (set by `/init`). Like E2B's server, each execution asks envd for them,
//! passing on the caller's `X-Access-Token`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::language::check_env_name;

const ENVD_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct EnvdClient {
    envs_uri: hyper::Uri,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl EnvdClient {
    /// `base` like `http://127.0.0.1:49983`.
    pub fn new(base: &str) -> Result<EnvdClient, hyper::http::uri::InvalidUri> {
        let envs_uri = format!("{}/envs", base.trim_end_matches('/')).parse()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(EnvdClient {
            envs_uri,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// The sandbox's variables, or `None` when envd cannot say (then the kernels keep
    /// what they have).
    pub async fn sandbox_env(
        &self,
        access_token: Option<&str>,
    ) -> Option<BTreeMap<String, String>> {
        let mut request = hyper::Request::get(self.envs_uri.clone());
        if let Some(token) = access_token {
            request = request.header("X-Access-Token", token);
        }
        let request = request.body(Empty::new()).ok()?;
        let fetch = async {
            let response = self.client.request(request).await.ok()?;
            if !response.status().is_success() {
                tracing::warn!(status = %response.status(), "envd refused GET /envs");
                return None;
            }
            let body = response.into_body().collect().await.ok()?.to_bytes();
            serde_json::from_slice::<HashMap<String, String>>(&body).ok()
        };
        let envs = match tokio::time::timeout(ENVD_TIMEOUT, fetch).await {
            Ok(Some(envs)) => envs,
            Ok(None) | Err(_) => {
                tracing::debug!(uri = %self.envs_uri, "no sandbox env vars from envd");
                return None;
            }
        };
        Some(
            envs.into_iter()
                .filter(|(name, _)| check_env_name(name).is_ok() && !name.is_empty())
                .collect(),
        )
    }
}
