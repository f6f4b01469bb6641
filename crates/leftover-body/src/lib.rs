//! Keeps HTTP/1.1 connections reusable when an answer leaves the request body unread.
//!
//! HTTP/1.1 can only carry the next request once this one's body is off the connection.
//! When a handler answers without reading the body (a 401 from a token check, a 404
//! for an unknown route, a 415 for a wrong content type) and the body has not all
//! arrived yet, hyper closes the connection after the answer; a client that pools
//! connections then sends its next request into a closing socket and gets "server
//! disconnected". [`read_what_the_answer_left`] reads such a body (HTTP/1.1, a small
//! declared length, a short wait) before the answer goes out.
//!
//! Owns: that middleware and the body wrapper it needs. Must not: read bodies a handler
//! still holds (a streaming upload, a client stream), or hold an answer longer than
//! [`LEFTOVER_BODY_WAIT`].

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, EXPECT};
use axum::http::{HeaderMap, Version};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};

/// The largest declared request body read after an answer that left it unread.
pub const LEFTOVER_BODY_LIMIT: usize = 64 * 1024;
/// How long an answer waits for the rest of an unread body.
pub const LEFTOVER_BODY_WAIT: Duration = Duration::from_secs(1);

/// Middleware (`axum::middleware::from_fn`): reads whatever request body the answer left
/// unread before the answer goes out. A body that does not come within
/// [`LEFTOVER_BODY_WAIT`] still ends the connection.
pub async fn read_what_the_answer_left(request: Request, next: Next) -> Response {
    if !worth_reading_after_the_answer(&request) {
        return next.run(request).await;
    }
    let leftover = Arc::new(Mutex::new(None));
    let request = request.map(|body| {
        Body::new(HandedBackOnDrop {
            body: Some(body),
            leftover: Arc::clone(&leftover),
        })
    });
    let response = next.run(request).await;
    let unread = leftover
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(body) = unread.filter(|_| !closes(response.headers())) {
        let _ = tokio::time::timeout(LEFTOVER_BODY_WAIT, discard(body)).await;
    }
    response
}

/// Whether a body the answer may leave unread is worth reading: only on an HTTP/1.1
/// connection that stays open (on h2 a dropped body costs nothing but its stream), with
/// a declared length of at most [`LEFTOVER_BODY_LIMIT`] (a stream of unknown length
/// may never end), and not when the client waits for `100 Continue` before sending it
/// (reading would ask for a body nobody wants; hyper answers without the go-ahead).
fn worth_reading_after_the_answer(request: &Request) -> bool {
    let headers = request.headers();
    let declared_length = headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    request.version() == Version::HTTP_11
        && declared_length.is_some_and(|n| n > 0 && n <= LEFTOVER_BODY_LIMIT)
        && !headers.contains_key(EXPECT)
        && !closes(headers)
}

/// Whether these headers end the connection after this exchange (`Connection: close`).
fn closes(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case("close"))
}

/// Reads `body` to its end, keeping none of it.
async fn discard(mut body: Body) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// A request body that, dropped before its end, puts itself in `leftover` instead of
/// going away, so that [`read_what_the_answer_left`] can finish reading it.
struct HandedBackOnDrop {
    body: Option<Body>,
    leftover: Arc<Mutex<Option<Body>>>,
}

impl hyper::body::Body for HandedBackOnDrop {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.get_mut().body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for HandedBackOnDrop {
    fn drop(&mut self) {
        if let Some(body) = self.body.take().filter(|body| !body.is_end_stream()) {
            *self.leftover.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
        }
    }
}

/// A raw HTTP/1.1 exchange for tests of connection reuse (feature `test-support`): no
/// client library, so the body's timing and the connection are the test's own.
#[cfg(any(test, feature = "test-support"))]
pub mod testing {
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;

    /// Sends `head` (a request line and headers, each ending in CRLF; `Host` and
    /// `Content-Length` are added) to `address` and its `body` 50 ms later, as a
    /// client's second segment, then `next` (a whole request) on the same connection.
    /// Returns the first answer's status line and the second answer's status line and
    /// body, `None` when the connection did not carry it.
    pub async fn late_body_then(
        address: &str,
        head: &str,
        body: &[u8],
        next: &str,
    ) -> (String, Option<(String, String)>) {
        let mut stream = BufReader::new(TcpStream::connect(address).await.unwrap());
        stream.get_mut().set_nodelay(true).unwrap();
        let head = format!(
            "{head}Host: {address}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.get_mut().write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stream.get_mut().write_all(body).await.unwrap();
        let (first, _) = response(&mut stream)
            .await
            .expect("an answer to the first request");
        if stream.get_mut().write_all(next.as_bytes()).await.is_err() {
            return (first, None);
        }
        (first, response(&mut stream).await)
    }

    /// Reads one response off `stream`: its status line and body; `None` when the
    /// connection ended first.
    pub async fn response(stream: &mut BufReader<TcpStream>) -> Option<(String, String)> {
        let mut status = String::new();
        if stream.read_line(&mut status).await.ok()? == 0 {
            return None;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await.ok()?;
            if line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.ok()?;
        Some((status.trim_end().to_owned(), String::from_utf8(body).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{late_body_then, response};
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::Router;
    use tokio::io::{AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};

    /// Serves `/refuse` (answers 401 without reading the body) and `/read` (reads it),
    /// with or without the middleware; returns the address.
    async fn serve(with_middleware: bool) -> std::net::SocketAddr {
        let router = Router::new()
            .route("/refuse", post(|| async { StatusCode::UNAUTHORIZED }))
            .route(
                "/read",
                post(|body: Bytes| async move { body.len().to_string() }),
            );
        let router = if with_middleware {
            router.layer(axum::middleware::from_fn(read_what_the_answer_left))
        } else {
            router
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    /// A refused request whose body comes after its headers, then a second request on
    /// the same connection: the second one's answer, if the connection carried it.
    async fn refused_then_next(address: std::net::SocketAddr) -> Option<(String, String)> {
        let next = "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc";
        let (refused, answer) = late_body_then(
            &address.to_string(),
            "POST /refuse HTTP/1.1\r\n",
            b"hello",
            next,
        )
        .await;
        assert!(refused.contains("401"), "{refused}");
        answer
    }

    #[tokio::test]
    async fn the_connection_carries_the_next_request_after_a_refusal() {
        let answer = refused_then_next(serve(true).await).await;
        assert_eq!(answer, Some(("HTTP/1.1 200 OK".to_owned(), "3".to_owned())));
    }

    #[tokio::test]
    async fn without_it_hyper_closes_the_connection() {
        // The fault this crate exists for; if hyper ever drains such bodies itself, the
        // middleware can go.
        assert_eq!(refused_then_next(serve(false).await).await, None);
    }

    #[tokio::test]
    async fn a_body_the_handler_reads_is_not_read_again() {
        let address = serve(true).await;
        let mut stream = BufReader::new(TcpStream::connect(address).await.unwrap());
        for _ in 0..2 {
            let request = "POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nabcd";
            stream
                .get_mut()
                .write_all(request.as_bytes())
                .await
                .unwrap();
            let answer = response(&mut stream).await;
            assert_eq!(answer, Some(("HTTP/1.1 200 OK".to_owned(), "4".to_owned())));
        }
    }

    #[tokio::test]
    async fn a_client_waiting_for_100_continue_gets_the_answer_without_it() {
        let address = serve(true).await;
        let mut stream = BufReader::new(TcpStream::connect(address).await.unwrap());
        let head =
            "POST /refuse HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
        stream.get_mut().write_all(head.as_bytes()).await.unwrap();
        let (status, _) = response(&mut stream).await.unwrap();
        assert!(status.contains("401"), "{status}");
    }

    #[test]
    fn only_small_declared_bodies_on_open_http1_connections_are_read() {
        let request = |version: Version, headers: &[(&str, &str)]| {
            let mut builder = Request::builder().method("POST").uri("/").version(version);
            for (name, value) in headers {
                builder = builder.header(*name, *value);
            }
            builder.body(Body::empty()).unwrap()
        };
        let small = ("content-length", "5");
        assert!(worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[small]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_2,
            &[small]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_10,
            &[small]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[("content-length", "0")]
        )));
        let too_large = (LEFTOVER_BODY_LIMIT + 1).to_string();
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[("content-length", &too_large)]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[small, ("expect", "100-continue")]
        )));
        assert!(!worth_reading_after_the_answer(&request(
            Version::HTTP_11,
            &[small, ("connection", "keep-alive, Close")]
        )));
    }

    #[tokio::test]
    async fn a_body_that_never_comes_does_not_hold_the_answer() {
        let address = serve(true).await;
        let mut stream = BufReader::new(TcpStream::connect(address).await.unwrap());
        let head = "POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n";
        stream.get_mut().write_all(head.as_bytes()).await.unwrap();
        // Far beyond LEFTOVER_BODY_WAIT, so only a hang fails this.
        let answer = tokio::time::timeout(Duration::from_secs(30), response(&mut stream)).await;
        let (status, _) = answer
            .expect("the answer waited for a body that never came")
            .unwrap();
        assert!(status.contains("401"), "{status}");
    }
}
