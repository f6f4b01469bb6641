//! Webhook delivery: a background task POSTs queued events, signed with
//! `e2b-signature = base64url-no-pad(sha256(secret + body))`, retrying failures with
//! exponential backoff. API calls only queue deliveries; they never wait for them.
//!
//! Every delivery checks its URL again (`webhook_target`: the name is resolved now and
//! every address must be admitted) and connects to exactly the addresses that check
//! returned, one HTTP/1.1 connection per delivery: no resolver runs between the check
//! and the connection, and no pooled connection outlives a check. A redirect is an
//! answer like any other non-2xx: a failed attempt, never followed.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use berth_store::DeliveryAttempt;

use crate::webhook_target::{Target, WebhookGuard};
use crate::SharedState;

/// Header carrying the delivery signature.
pub const SIGNATURE_HEADER: &str = "e2b-signature";

/// Deliveries are abandoned after this many failed attempts.
const MAX_ATTEMPTS: u32 = 10;
/// Backoff after the first failure; doubles per attempt.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(600);
/// One delivery may take this long before it counts as failed.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_SLEEP: Duration = Duration::from_secs(5);

/// The signature of `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(secret.as_bytes());
    hasher.update(body);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize())
}

/// Delay before retry number `attempt` (0-based).
fn backoff(attempt: u32) -> Duration {
    FIRST_RETRY
        .checked_mul(1u32 << attempt.min(20))
        .unwrap_or(MAX_RETRY)
        .min(MAX_RETRY)
}

pub async fn run(state: SharedState) {
    loop {
        // Claimed for longer than an attempt can take: an instance that dies mid-delivery
        // leaves it to another once the claim lapses.
        let claim_for = DELIVERY_TIMEOUT * 3;
        match state
            .store
            .claim_due_deliveries(OffsetDateTime::now_utc(), 32, claim_for)
        {
            Ok(due) => {
                let attempts = due.into_iter().map(|delivery| {
                    let state = state.clone();
                    async move {
                        let outcome = deliver(&state.webhook_guard, &delivery.url, &delivery.secret, &delivery.body).await;
                        let (attempt, retry_at) = match outcome {
                            Ok(code) => (
                                DeliveryAttempt { delivered: true, response_code: Some(code), error: None },
                                None,
                            ),
                            Err(failure) => {
                                let attempt = DeliveryAttempt {
                                    delivered: false,
                                    response_code: failure.response_code,
                                    error: Some(failure.message.clone()),
                                };
                                if delivery.attempts + 1 >= MAX_ATTEMPTS {
                                    state.prometheus.webhook_failed("dropped");
                                    tracing::warn!(webhook = %delivery.webhook_id, err = %failure.message, "giving up on webhook delivery");
                                    (attempt, None)
                                } else {
                                    state.prometheus.webhook_failed("retry");
                                    tracing::debug!(webhook = %delivery.webhook_id, err = %failure.message, "webhook delivery failed; will retry");
                                    (attempt, Some(OffsetDateTime::now_utc() + backoff(delivery.attempts)))
                                }
                            }
                        };
                        if let Err(err) = state.store.record_delivery_attempt(delivery.id, &attempt, retry_at) {
                            tracing::error!(%err, "updating webhook delivery");
                        }
                    }
                });
                futures_join_all(attempts).await;
            }
            Err(err) => tracing::error!(%err, "listing webhook deliveries"),
        }
        let sleep = match state.store.next_delivery_at() {
            Ok(Some(next)) => Duration::try_from(next - OffsetDateTime::now_utc())
                .unwrap_or(Duration::ZERO)
                .min(MAX_SLEEP),
            Ok(None) | Err(_) => MAX_SLEEP,
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = state.delivery_wakeup.notified() => {}
        }
    }
}

async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    while set.join_next().await.is_some() {}
}

/// Why one delivery attempt failed.
#[derive(Debug)]
pub(crate) struct DeliveryFailure {
    /// The receiver's answer, when it gave one.
    pub response_code: Option<u16>,
    pub message: String,
}

impl From<String> for DeliveryFailure {
    fn from(message: String) -> Self {
        DeliveryFailure {
            response_code: None,
            message,
        }
    }
}

/// One delivery attempt: check the URL now, then POST to the checked addresses only.
/// Returns the receiver's (2xx) status.
pub(crate) async fn deliver(
    guard: &WebhookGuard,
    url: &str,
    secret: &str,
    body: &str,
) -> Result<u16, DeliveryFailure> {
    let target = guard.check(url).await.map_err(|err| err.to_string())?;
    tokio::time::timeout(DELIVERY_TIMEOUT, post(&target, secret, body))
        .await
        .map_err(|_| format!("no answer within {DELIVERY_TIMEOUT:?}"))?
}

async fn post(target: &Target, secret: &str, body: &str) -> Result<u16, DeliveryFailure> {
    let stream = connect(target).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(connection);
    let path = target
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let request = hyper::Request::post(path)
        .header("host", &target.authority)
        .header("content-type", "application/json")
        .header(SIGNATURE_HEADER, sign(secret, body.as_bytes()))
        .header("user-agent", "berth-webhooks")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|err| err.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| err.to_string())?;
    let status = response.status();
    let _ = response.into_body().collect().await;
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let message = if status.is_redirection() {
        format!("receiver answered {status}; redirects are not followed")
    } else {
        format!("receiver answered {status}")
    };
    Err(DeliveryFailure {
        response_code: Some(status.as_u16()),
        message,
    })
}

/// A TCP connection to the first of the target's checked addresses that accepts one.
async fn connect(target: &Target) -> Result<tokio::net::TcpStream, String> {
    let mut last = String::from("no address");
    for addr in &target.addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = format!("connecting to {addr}: {err}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_base64url_sha256_of_secret_then_body() {
        // sha256("abc") = ba7816bf…, base64url without padding.
        assert_eq!(
            sign("a", b"bc"),
            "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(30), MAX_RETRY);
    }
}
