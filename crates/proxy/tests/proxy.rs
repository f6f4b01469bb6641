//! The proxy against a real upstream server over real loopback connections.

mod common;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_envd_proto::ENVD_PORT;
use bytes::Bytes;
use common::{full_body, http1_client, json_of, OPEN_SANDBOX, SECURE_SANDBOX, USER_PORT};
use futures::{SinkExt, StreamExt};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// Turns a hang (the failure mode of a buffering proxy) into a test failure; the
/// bound is far above any healthy run and is not a timing assertion.
async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), future)
        .await
        .expect("the exchange hung: the proxy is holding data back")
}

fn to_sandbox(sandbox: &str, port: u16, method: Method, path: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("E2b-Sandbox-Id", sandbox)
        .header("E2b-Sandbox-Port", port.to_string())
}

#[tokio::test]
async fn chunked_response_arrives_incrementally() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::GET, "/stream")
        .body(full_body(""))
        .unwrap();
    let response = bounded(client.send_request(request)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The upstream sends "second" only after this test has seen "first", so a proxy
    // that waited for the whole body would never deliver anything.
    let first = bounded(body.frame()).await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"first"));
    harness.upstream.release_second_chunk.notify_one();
    let rest = bounded(body.collect()).await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from_static(b"second"));
}

#[tokio::test]
async fn upload_is_streamed_in_lock_step() {
    const CHUNK: usize = 1 << 20;
    const CHUNKS: u64 = 32;
    let harness = common::start().await;
    let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
    *harness.upstream.upload_progress.lock().unwrap() = Some(progress_tx);

    let (body_tx, body_rx) = mpsc::channel::<Result<Frame<Bytes>, berth_proxy::BoxError>>(1);
    let body = StreamBody::new(tokio_stream_from(body_rx)).boxed_unsync();
    let mut client = http1_client(harness.front).await;
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::POST, "/upload")
        .body(body)
        .unwrap();
    let response = tokio::spawn(async move { client.send_request(request).await });

    let chunk = Bytes::from(vec![7u8; CHUNK]);
    for sent_chunks in 1..=CHUNKS {
        body_tx.send(Ok(Frame::data(chunk.clone()))).await.unwrap();
        // The next chunk is only produced once the upstream has received this one:
        // completes only if the proxy forwards as it receives.
        let expected = sent_chunks * CHUNK as u64;
        loop {
            let received = bounded(progress_rx.recv()).await.unwrap();
            if received >= expected {
                break;
            }
        }
    }
    drop(body_tx);
    let response = bounded(response).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let total = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(total, (CHUNKS * CHUNK as u64).to_string());
}

#[tokio::test]
async fn an_answer_sent_before_the_upload_ends_reaches_the_client() {
    const CHUNK: usize = 1 << 20;
    let harness = common::start().await;
    let chunk = Bytes::from(vec![7u8; CHUNK]);
    // Far more than the socket buffers hold, so the sandbox stops reading long before
    // the client stops sending.
    let frames = futures::stream::iter(
        (0..256).map(move |_| Ok::<_, berth_proxy::BoxError>(Frame::data(chunk.clone()))),
    );
    let mut client = http1_client(harness.front).await;
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::POST, "/full")
        .header("content-length", (256 * CHUNK).to_string())
        .body(StreamBody::new(frames).boxed_unsync())
        .unwrap();
    let response = bounded(client.send_request(request)).await.unwrap();
    let (status, body) = json_of(response).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(body["code"], 507, "{body}");
}

fn tokio_stream_from<T>(mut receiver: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[tokio::test]
async fn websocket_echo_through_headers_and_path_prefix() {
    let harness = common::start().await;

    let mut by_headers = format!("ws://{}/ws", harness.front)
        .into_client_request()
        .unwrap();
    by_headers
        .headers_mut()
        .insert("E2b-Sandbox-Id", OPEN_SANDBOX.id.parse().unwrap());
    by_headers
        .headers_mut()
        .insert("E2b-Sandbox-Port", USER_PORT.to_string().parse().unwrap());
    let by_path = format!(
        "ws://{}/proxy/{}/{}/ws",
        harness.front, OPEN_SANDBOX.id, USER_PORT
    )
    .into_client_request()
    .unwrap();

    for request in [by_headers, by_path] {
        let (mut socket, response) = bounded(tokio_tungstenite::connect_async(request))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        for round in 0..3 {
            socket
                .send(Message::Text(format!("hello {round}").into()))
                .await
                .unwrap();
            let reply = bounded(socket.next()).await.unwrap().unwrap();
            assert_eq!(reply, Message::Text(format!("echo:hello {round}").into()));
        }
        let payload = vec![0xabu8; 256 * 1024];
        socket
            .send(Message::Binary(payload.clone().into()))
            .await
            .unwrap();
        let reply = bounded(socket.next()).await.unwrap().unwrap();
        assert_eq!(reply, Message::Binary(payload.into()));
        socket.close(None).await.unwrap();
    }
}

#[tokio::test]
async fn unknown_sandbox_and_closed_port_get_the_sdk_502() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;

    let request = to_sandbox("inosuchsandbox", ENVD_PORT, Method::GET, "/health")
        .body(full_body(""))
        .unwrap();
    let (status, json) = json_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        json,
        serde_json::json!({"sandboxId": "inosuchsandbox", "message": "The sandbox was not found", "code": 502})
    );

    let request = to_sandbox(OPEN_SANDBOX.id, 9, Method::GET, "/")
        .body(full_body(""))
        .unwrap();
    let (status, json) = json_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(json["sandboxId"], OPEN_SANDBOX.id);
    assert_eq!(json["port"], 9);
    assert!(json["message"]
        .as_str()
        .unwrap()
        .contains("port is not open"));
}

#[tokio::test]
async fn internal_envd_routes_are_refused_before_reaching_the_sandbox() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    for path in [
        "/init",
        "//init",
        "/%69nit",
        "/init/",
        "/x/../init",
        "/freeze?maxWaitMs=1",
    ] {
        let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::POST, path)
            .body(full_body("{}"))
            .unwrap();
        let (status, json) = json_of(client.send_request(request).await.unwrap()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(json["code"], 403);
    }
    let by_path = Request::post(format!("/proxy/{}/{ENVD_PORT}/init", OPEN_SANDBOX.id))
        .header("host", "127.0.0.1")
        .body(full_body("{}"))
        .unwrap();
    let (status, _) = json_of(client.send_request(by_path).await.unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(harness.upstream.internal_hits.load(Ordering::SeqCst), 0);

    // The same path on a user port is the app's own business.
    let user_port = to_sandbox(OPEN_SANDBOX.id, USER_PORT, Method::POST, "/init")
        .body(full_body(""))
        .unwrap();
    let response = client.send_request(user_port).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(harness.upstream.internal_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn access_tokens_are_enforced() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    let secure = SECURE_SANDBOX.id;

    let without = to_sandbox(secure, ENVD_PORT, Method::GET, "/echo")
        .body(full_body(""))
        .unwrap();
    let (status, json) = json_of(client.send_request(without).await.unwrap()).await;
    assert_eq!(
        (status, json["code"].as_u64()),
        (StatusCode::UNAUTHORIZED, Some(401))
    );

    let wrong = to_sandbox(secure, ENVD_PORT, Method::GET, "/echo")
        .header("X-Access-Token", "guess")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(wrong).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );

    let with = to_sandbox(secure, ENVD_PORT, Method::GET, "/echo")
        .header("X-Access-Token", SECURE_SANDBOX.envd_access_token.unwrap())
        .body(full_body(""))
        .unwrap();
    let (status, _) = json_of(client.send_request(with).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);

    let user_without = to_sandbox(secure, USER_PORT, Method::GET, "/echo")
        .body(full_body(""))
        .unwrap();
    let (status, json) = json_of(client.send_request(user_without).await.unwrap()).await;
    assert_eq!(
        (status, json["code"].as_u64()),
        (StatusCode::FORBIDDEN, Some(403))
    );

    let user_with = to_sandbox(secure, USER_PORT, Method::GET, "/echo")
        .header(
            "e2b-traffic-access-token",
            SECURE_SANDBOX.traffic_access_token.unwrap(),
        )
        .body(full_body(""))
        .unwrap();
    let (status, echoed) = json_of(client.send_request(user_with).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    // The proxy's own credentials and routing headers stay at the proxy.
    let headers = echoed["headers"].as_object().unwrap();
    for name in [
        "e2b-traffic-access-token",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
    ] {
        assert!(!headers.contains_key(name), "{name} leaked to the sandbox");
    }

    // Public sandboxes need no traffic token.
    let open = to_sandbox(OPEN_SANDBOX.id, USER_PORT, Method::GET, "/echo")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(open).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn malformed_addresses_are_rejected() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    for (id, port) in [
        ("IOPEN", "49983"),
        ("i-open", "49983"),
        ("iopen", "0"),
        ("iopen", "x"),
    ] {
        let request = Request::get("/health")
            .header("host", "127.0.0.1")
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", port)
            .body(full_body(""))
            .unwrap();
        let (status, json) = json_of(client.send_request(request).await.unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id} {port}");
        assert_eq!(json["code"], 400);
    }
    let bad_host = Request::get("/")
        .header("host", "8080-i_x.berth.test")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(bad_host).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn host_and_path_addressing_reach_the_right_path() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;

    let by_host = Request::post("/echo?x=1")
        .header(
            "host",
            format!("{USER_PORT}-{}.berth.test", OPEN_SANDBOX.id),
        )
        .body(full_body("payload"))
        .unwrap();
    let (status, echoed) = json_of(client.send_request(by_host).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed["uri"], "/echo?x=1");
    assert_eq!(echoed["body"], "payload");
    assert_eq!(
        echoed["headers"]["host"],
        format!("{USER_PORT}-{}.berth.test", OPEN_SANDBOX.id)
    );

    let by_path = Request::put(format!("/proxy/{}/{USER_PORT}/echo?y=2", OPEN_SANDBOX.id))
        .header("host", "127.0.0.1")
        .body(full_body("put"))
        .unwrap();
    let (status, echoed) = json_of(client.send_request(by_path).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed["method"], "PUT");
    assert_eq!(echoed["uri"], "/echo?y=2");

    let not_sandbox = Request::get("/sandboxes")
        .header("host", "127.0.0.1")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(not_sandbox).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn h2c_clients_are_forwarded_over_http1() {
    let harness = common::start().await;
    let stream = tokio::net::TcpStream::connect(harness.front).await.unwrap();
    let (mut client, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);

    let mut replies = Vec::new();
    for index in 0..4 {
        let request = Request::post(format!("http://{}/echo", harness.front))
            .header("E2b-Sandbox-Id", OPEN_SANDBOX.id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
            .body(full_body(format!("h2 body {index}")))
            .unwrap();
        replies.push(client.send_request(request));
    }
    for (index, reply) in futures::future::join_all(replies)
        .await
        .into_iter()
        .enumerate()
    {
        let (status, echoed) = json_of(reply.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(echoed["body"], format!("h2 body {index}"));
        assert_eq!(echoed["uri"], "/echo");
        assert_eq!(echoed["headers"]["host"], harness.front.to_string());
    }

    let streamed = Request::get(format!("http://{}/stream", harness.front))
        .header("E2b-Sandbox-Id", OPEN_SANDBOX.id)
        .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
        .body(full_body(""))
        .unwrap();
    let mut body = bounded(client.send_request(streamed))
        .await
        .unwrap()
        .into_body();
    let first = bounded(body.frame()).await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"first"));
    harness.upstream.release_second_chunk.notify_one();
    let rest = bounded(body.collect()).await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from_static(b"second"));
}

#[tokio::test]
async fn sequential_requests_reuse_one_sandbox_connection() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    echo_through_envd(&mut client, 10).await;
    assert_eq!(harness.connects.load(Ordering::SeqCst), 1);

    // Another port is another connection.
    let request = to_sandbox(OPEN_SANDBOX.id, USER_PORT, Method::GET, "/echo")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(request).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(harness.connects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_the_server_kept_serves_the_first_proxied_request() {
    let harness = common::start().await;
    // The server's own call into a sandbox it brings up (as envd's `/init`).
    let request = Request::post("/echo")
        .header("host", "localhost")
        .body(full_body("from the server"))
        .unwrap();
    let response = send_and_keep(&harness, OPEN_SANDBOX.id, request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let echoed: serde_json::Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(echoed["body"], "from the server");
    assert_eq!(harness.connections.stats().connections_open, 1);

    // The client's first call through the proxy finds that connection open.
    let mut client = http1_client(harness.front).await;
    echo_through_envd(&mut client, 3).await;
    assert_eq!(harness.connects.load(Ordering::SeqCst), 0);
    assert_eq!(harness.connections.stats().connections_opened, 1);

    // Closing the sandbox's connections closes the kept one too.
    harness.connections.close_all(OPEN_SANDBOX.id);
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::GET, "/echo")
        .body(full_body(""))
        .unwrap();
    assert_eq!(
        client.send_request(request).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(harness.connects.load(Ordering::SeqCst), 1);

    let request = Request::get("/echo").body(full_body("")).unwrap();
    assert!(matches!(
        send_and_keep(&harness, "not/an id", request).await,
        Err(berth_proxy::DirectRequestError::InvalidSandboxId(_))
    ));
}

#[tokio::test]
async fn a_kept_connection_serves_the_servers_next_call_and_none_is_opened() {
    let harness = common::start().await;
    let echo = |body: &'static str| {
        Request::post("/echo")
            .header("host", "localhost")
            .body(full_body(body))
            .unwrap()
    };
    // Nothing kept yet: the request comes back to the caller, which opens a connection.
    assert!(harness
        .connections
        .send_on_kept(OPEN_SANDBOX.id, ENVD_PORT, echo("unsent"))
        .await
        .is_none());
    let first = send_and_keep(&harness, OPEN_SANDBOX.id, echo("health"))
        .await
        .unwrap();
    first.into_body().collect().await.unwrap();

    // The server's next call (a claim's `/init`) goes over the kept connection, twice.
    for body in ["init", "again"] {
        let response = harness
            .connections
            .send_on_kept(OPEN_SANDBOX.id, ENVD_PORT, echo(body))
            .await
            .expect("the kept connection is open")
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let echoed: serde_json::Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                .unwrap();
        assert_eq!(echoed["body"], body);
    }
    assert_eq!(harness.connections.stats().connections_opened, 1);

    // A connection closed with the sandbox's is not taken; nor is one for another port.
    assert!(harness
        .connections
        .send_on_kept(OPEN_SANDBOX.id, ENVD_PORT + 1, echo("other port"))
        .await
        .is_none());
    harness.connections.close_all(OPEN_SANDBOX.id);
    assert!(harness
        .connections
        .send_on_kept(OPEN_SANDBOX.id, ENVD_PORT, echo("closed"))
        .await
        .is_none());
    assert!(harness
        .connections
        .send_on_kept("not/an id", ENVD_PORT, echo("bad id"))
        .await
        .is_none());
}

/// `count` POSTs to envd's port of the open sandbox through the proxy, each echoed back.
async fn echo_through_envd(client: &mut common::Http1Client, count: usize) {
    for index in 0..count {
        let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::POST, "/echo")
            .body(full_body(format!("request {index}")))
            .unwrap();
        let (status, echoed) = json_of(client.send_request(request).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(echoed["body"], format!("request {index}"));
    }
}

/// `request` to envd's port of `sandbox` over a connection opened as the server opens
/// one, kept for the proxy.
async fn send_and_keep(
    harness: &common::Harness,
    sandbox: &str,
    request: Request<berth_proxy::ProxyBody>,
) -> Result<http::Response<berth_proxy::ProxyBody>, berth_proxy::DirectRequestError> {
    let stream = tokio::net::TcpStream::connect(harness.upstream_address)
        .await
        .unwrap();
    harness
        .connections
        .send_and_keep(sandbox, ENVD_PORT, stream, request)
        .await
}

#[tokio::test]
async fn connections_the_sandbox_closes_are_not_reused() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    for _ in 0..5 {
        let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::GET, "/close")
            .body(full_body(""))
            .unwrap();
        let response = client.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"closing"));
    }
    assert_eq!(harness.connects.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_body_abandoned_midway_does_not_poison_the_pool() {
    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::GET, "/stream")
        .body(full_body(""))
        .unwrap();
    let response = bounded(client.send_request(request)).await.unwrap();
    let mut body = response.into_body();
    let first = bounded(body.frame()).await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"first"));
    // The client goes away in the middle of the stream.
    drop(body);
    drop(client);

    let mut client = http1_client(harness.front).await;
    let request = to_sandbox(OPEN_SANDBOX.id, ENVD_PORT, Method::POST, "/echo")
        .body(full_body("after"))
        .unwrap();
    let (status, echoed) = json_of(bounded(client.send_request(request)).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echoed["body"], "after");
    assert_eq!(harness.connects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn signed_file_urls_reach_the_sandbox_whose_token_signed_them() {
    use berth_envd_proto::signature::{file_signature, FileOperation};

    let harness = common::start().await;
    let mut client = http1_client(harness.front).await;
    let token = SECURE_SANDBOX.envd_access_token.unwrap();
    let encode = |signature: &str| signature.replace('+', "%2B").replace('/', "%2F");
    let signed = file_signature("/home/user/a b", FileOperation::Read, "", token, None);
    let uri = format!(
        "/files?path=%2Fhome%2Fuser%2Fa%20b&signature={}",
        encode(&signed)
    );
    // No sandbox id anywhere: not in the host, the path or a header.
    let request = Request::get(&uri)
        .header("host", "127.0.0.1")
        .body(full_body(""))
        .unwrap();
    let (status, echoed) = json_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{echoed}");
    assert_eq!(echoed["uri"], uri.as_str());

    let mut refusals = Vec::new();
    for uri in [
        // Forged, and signed for another path (a write of the signed path follows).
        "/files?path=x&signature=v1_forged".to_owned(),
        uri.replace("a%20b", "c"),
    ] {
        let request = Request::get(&uri)
            .header("host", "127.0.0.1")
            .body(full_body(""))
            .unwrap();
        refusals.push(json_of(client.send_request(request).await.unwrap()).await);
    }
    let request = Request::post(&uri)
        .header("host", "127.0.0.1")
        .body(full_body(""))
        .unwrap();
    refusals.push(json_of(client.send_request(request).await.unwrap()).await);
    for (status, json) in &refusals {
        assert_eq!(*status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            *json,
            serde_json::json!({"code": 401, "message": "Invalid signature"})
        );
    }
    let expired = file_signature("/a", FileOperation::Read, "", token, Some(1));
    let request = Request::get(format!(
        "/files?path=/a&signature={}&signature_expiration=1",
        encode(&expired)
    ))
    .header("host", "127.0.0.1")
    .body(full_body(""))
    .unwrap();
    let (status, json) = json_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(json["message"], "Signature is already expired");
}
