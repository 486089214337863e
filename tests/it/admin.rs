//! The admin endpoint: hot load over HTTP, on a Unix socket (no token, mode 0600) or
//! on TCP (token required), with its limits on connections, time and size.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use groupstate::admin::{AdminError, AdminLimits, AdminServer, Listen, serve};
use groupstate_tests::plugins;

use crate::hotload::Harness;

const TOKEN: &str = "s3cret-token";

/// The admin endpoint's view of the harness's pipeline.
fn admin(h: &Harness, token: Option<&str>, limits: AdminLimits) -> groupstate::admin::Admin {
    groupstate::admin::Admin {
        runtime: h.pipeline.runtime().unwrap(),
        params: Vec::new(),
        upload_dir: h.dir.path().join("uploads"),
        sender: h.pipeline.swap_sender(),
        status: h.pipeline.plugin_status(),
        token: token.map(str::to_owned),
        limits,
    }
}

/// A TCP endpoint on a free loopback port, with the token.
fn serve_tcp(h: &Harness, limits: AdminLimits) -> (AdminServer, SocketAddr) {
    let server = serve(Listen::Tcp("127.0.0.1:0".parse().unwrap()), admin(h, Some(TOKEN), limits)).unwrap();
    let Listen::Tcp(addr) = *server.listen() else { panic!("not TCP: {}", server.listen()) };
    (server, addr)
}

/// A client connection whose reads give up after 20 s, so that a server that never
/// answers fails the test instead of hanging it.
fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream
}

/// A request for /plugin, with a body length and the token when given.
fn request(method: &str, token: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} /plugin HTTP/1.1\r\nhost: groupstate\r\ncontent-length: {}\r\n", body.len());
    if let Some(token) = token {
        head.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}

/// Reads one response: its status and JSON body (by its content-length, so the
/// connection can stay open for another).
fn read_response(stream: &mut impl Read) -> (u16, serde_json::Value) {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).unwrap();
        assert_eq!(n, 1, "connection closed in the response head: {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap();
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, serde_json::Value) {
    let mut stream = connect(addr);
    stream.write_all(request).unwrap();
    read_response(&mut stream)
}

/// Whether the server has closed the connection: a read gives end of file or a reset,
/// not the read timeout.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match stream.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

fn uploads(h: &Harness) -> usize {
    std::fs::read_dir(h.dir.path().join("uploads")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn admin_endpoint_accepts_a_version_and_reports_the_running_one() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    let (server, addr) = serve_tcp(&h, AdminLimits::default());
    let wasm = std::fs::read(plugins::COUNTER_V2).unwrap();
    let (status, body) = exchange(addr, &request("POST", Some(TOKEN), b"garbage"));
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("not a WebAssembly file"));
    // Uploads do not pile up: only the newest 8 files are kept.
    for i in 0..12 {
        assert_eq!(exchange(addr, &request("POST", Some(TOKEN), format!("garbage {i}").as_bytes())).0, 422);
    }
    assert_eq!(uploads(&h), 8);
    let (status, body) = exchange(addr, &request("POST", Some(TOKEN), &wasm));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["queued"]["version"], "2.0.0");

    h.feed(40, "");
    h.drain();
    let (status, body) = exchange(addr, &request("GET", Some(TOKEN), b""));
    assert_eq!(status, 200);
    assert!(body["running"].as_str().unwrap().contains("counter 2.0.0"), "{body}");
    assert_eq!(body["swaps"][0]["batch"], 0);
    assert_eq!(h.last_counts(), h.sent);
    assert_eq!(exchange(addr, &request("PUT", Some(TOKEN), b"")).0, 405);
    let (status, _) = exchange(addr, b"GET /other HTTP/1.1\r\nauthorization: Bearer s3cret-token\r\n\r\n");
    assert_eq!(status, 404);
    // Dropping the handle stops the server: the port no longer answers.
    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "the server outlived its handle");
}

#[test]
fn idle_connections_do_not_block_a_swap() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    let (_server, addr) = serve_tcp(&h, AdminLimits::default());
    // Three clients connect and send nothing, a fourth half a request head: the old
    // one-connection server gave each 30 s in turn before it read the next.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"POST /plugin HTTP/1.1\r\ncontent-le").unwrap();

    let wasm = std::fs::read(plugins::COUNTER_V2).unwrap();
    let (status, body) = exchange(addr, &request("POST", Some(TOKEN), &wasm));
    assert_eq!(status, 202, "{body}");
    h.feed(40, "");
    h.drain();
    let status = h.pipeline.plugin_status().lock().unwrap().clone();
    assert!(status.running.contains("counter 2.0.0"), "{status:?}");
    assert_eq!(h.outputs().last().unwrap()["version"], 2);
    assert_eq!(h.last_counts(), h.sent);
    drop((idle, half));
}

#[test]
fn connections_past_the_limit_are_closed_at_once_and_a_freed_slot_serves_again() {
    let h = Harness::new(plugins::COUNTER_V1);
    let limits = AdminLimits { connections_max: 2, ..AdminLimits::default() };
    let (_server, addr) = serve_tcp(&h, limits);
    let mut held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut third = connect(addr);
    assert!(closed_by_server(&mut third), "a third connection was kept past connections_max = 2");
    held.pop();
    // The slot frees once the server sees the close; a few tries cover that moment.
    let served = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        let mut stream = connect(addr);
        stream.write_all(&request("GET", Some(TOKEN), b"")).is_ok() && !closed_by_server_before_answer(&mut stream)
    });
    assert!(served, "no connection was served after one of the two closed");
}

/// Whether a request sent on `stream` went unanswered because the server closed it.
fn closed_by_server_before_answer(stream: &mut TcpStream) -> bool {
    let mut first = [0u8; 12];
    match stream.read_exact(&mut first) {
        Ok(()) => {
            assert_eq!(&first, b"HTTP/1.1 200");
            false
        }
        Err(_) => true,
    }
}

#[test]
fn tcp_needs_a_non_empty_token_and_a_wrong_one_gets_401() {
    let h = Harness::new(plugins::COUNTER_V1);
    let loopback = || Listen::Tcp("127.0.0.1:0".parse().unwrap());
    let err = serve(loopback(), admin(&h, None, AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::TokenRequired(_)), "{err}");
    assert!(err.to_string().contains("needs --admin-token") && err.to_string().contains("--admin unix"), "{err}");
    let err = serve(loopback(), admin(&h, Some(""), AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::EmptyToken), "{err}");
    let socket = Listen::Unix(h.dir.path().join("a.sock"));
    let err = serve(socket, admin(&h, Some(""), AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::EmptyToken), "{err}");

    let (_server, addr) = serve_tcp(&h, AdminLimits::default());
    // Same length, one byte off; a prefix; longer; no header; another scheme.
    for token in ["s3cret-tokex", "s3cret", "s3cret-token2"] {
        let (status, body) = exchange(addr, &request("GET", Some(token), b""));
        assert_eq!(status, 401, "{token}: {body}");
        assert_eq!(body["error"], "missing or wrong bearer token");
    }
    // A client without the token gets one answer per connection.
    let mut stream = connect(addr);
    stream.write_all(&request("GET", None, b"")).unwrap();
    assert_eq!(read_response(&mut stream).0, 401);
    assert!(closed_by_server(&mut stream), "a connection stayed open after a 401");
    assert_eq!(exchange(addr, b"GET /plugin HTTP/1.1\r\nauthorization: Basic s3cret-token\r\n\r\n").0, 401);
    // A wrong token is refused before the body: nothing is stored.
    assert_eq!(exchange(addr, &request("POST", Some("s3cret-tokex"), b"garbage")).0, 401);
    assert_eq!(uploads(&h), 0);
    assert_eq!(exchange(addr, &request("GET", Some(TOKEN), b"")).0, 200);
}

#[test]
fn the_cli_refuses_tcp_without_a_token_and_an_empty_token_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(p("in.jsonl"), "").unwrap();
    let mut args = crate::cli::sensor_run_args(&p("in.jsonl"), &p("out.jsonl"), &p("state"));
    args.extend(["--admin", "127.0.0.1:0"].map(String::from));
    let run = |token: Option<&str>| {
        let mut command = std::process::Command::new(crate::cli::groupstate_bin());
        command.args(&args).env_remove("GROUPSTATE_ADMIN_TOKEN");
        if let Some(token) = token {
            command.env("GROUPSTATE_ADMIN_TOKEN", token);
        }
        command.output().unwrap()
    };
    let out = run(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("needs --admin-token"), "{stderr}");
    let out = run(Some(""));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("the token is empty"), "{stderr}");
    // Refused before the pipeline opened: no state dir was made.
    assert!(!dir.path().join("state").exists());
}

#[test]
fn the_cli_serves_a_socket_in_the_state_dir_by_default_and_removes_it_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let input = groupstate_tests::sensor_input(dir.path(), 1000, 10, 1);
    let mut args = crate::cli::sensor_run_args(input.to_str().unwrap(), &p("out.jsonl"), &p("state"));
    args.push("--admin".into());
    let out = std::process::Command::new(crate::cli::groupstate_bin())
        .args(&args)
        .env_remove("GROUPSTATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let socket = dir.path().join("state").join("admin.sock");
    assert!(stderr.contains(&format!("admin endpoint on unix:{}", socket.display())), "{stderr}");
    assert!(!socket.exists(), "the socket outlived the run");
}

#[test]
fn a_unix_socket_is_mode_0600_serves_without_a_token_and_goes_away_with_the_server() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    let listen = Listen::parse("unix", &h.dir.path().join("state")).unwrap();
    let Listen::Unix(path) = listen.clone() else { panic!("{listen}") };
    let server = serve(listen.clone(), admin(&h, None, AdminLimits::default())).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // No staging directory is left beside it.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".admin"))
        .collect();
    assert!(names.is_empty(), "{names:?}");

    let unix_exchange = |request: &[u8]| {
        let mut stream = UnixStream::connect(&path).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(request).unwrap();
        read_response(&mut stream)
    };
    let (status, body) = unix_exchange(&request("GET", None, b""));
    assert_eq!(status, 200, "{body}");
    assert!(body["running"].as_str().unwrap().contains("counter 1.0.0"), "{body}");
    let wasm = std::fs::read(plugins::COUNTER_V2).unwrap();
    let (status, body) = unix_exchange(&request("POST", None, &wasm));
    assert_eq!(status, 202, "{body}");
    h.feed(40, "");
    h.drain();
    assert!(h.pipeline.plugin_status().lock().unwrap().running.contains("counter 2.0.0"));

    // A second server on the same path is refused while the first answers.
    let err = serve(listen.clone(), admin(&h, None, AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::SocketInUse(_)), "{err}");
    drop(server);
    assert!(!path.exists(), "the socket outlived its server");

    // A socket left by a run that did not stop cleanly is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = serve(listen.clone(), admin(&h, None, AdminLimits::default())).unwrap();
    assert_eq!(unix_exchange(&request("GET", None, b"")).0, 200);
    drop(server);
    // A path too long for a socket is refused with what to do.
    let long = Listen::Unix(h.dir.path().join("x".repeat(100)).join("admin.sock"));
    let err = serve(long, admin(&h, None, AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::SocketPathTooLong(_)), "{err}");
    assert!(err.to_string().contains("--admin unix:PATH"), "{err}");
    // A file that is not a socket is left alone.
    std::fs::write(&path, "mine").unwrap();
    let err = serve(listen, admin(&h, None, AdminLimits::default())).err().unwrap();
    assert!(matches!(err, AdminError::NotASocket(_)), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
}

#[test]
fn a_token_given_with_a_socket_is_required_there_too() {
    let h = Harness::new(plugins::COUNTER_V1);
    let path = h.dir.path().join("a.sock");
    let _server = serve(Listen::Unix(path.clone()), admin(&h, Some(TOKEN), AdminLimits::default())).unwrap();
    let exchange = |token: Option<&str>| {
        let mut stream = UnixStream::connect(&path).unwrap();
        stream.write_all(&request("GET", token, b"")).unwrap();
        read_response(&mut stream).0
    };
    assert_eq!(exchange(None), 401);
    assert_eq!(exchange(Some(TOKEN)), 200);
}

#[test]
fn a_body_over_the_limit_gets_413_and_nothing_is_written() {
    let h = Harness::new(plugins::COUNTER_V1);
    // The default limit, 64 MiB: a declared length past it is refused before the body,
    // which this client never sends.
    let (server, addr) = serve_tcp(&h, AdminLimits::default());
    let head =
        format!("POST /plugin HTTP/1.1\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: {}\r\n\r\n", (64 << 20) + 1);
    let (status, body) = exchange(addr, head.as_bytes());
    assert_eq!(status, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains("over 67108864 bytes"), "{body}");
    drop(server);

    let (_server, addr) = serve_tcp(&h, AdminLimits { body_bytes_max: 1024, ..AdminLimits::default() });
    let (status, _) = exchange(addr, &request("POST", Some(TOKEN), &[b'x'; 1025]));
    assert_eq!(status, 413);
    // Without a declared length (chunked), the count stops it while it streams in.
    let mut chunked =
        format!("POST /plugin HTTP/1.1\r\nauthorization: Bearer {TOKEN}\r\ntransfer-encoding: chunked\r\n\r\n")
            .into_bytes();
    for _ in 0..4 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b'x'; 0x200]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, body) = exchange(addr, &chunked);
    assert_eq!(status, 413, "{body}");
    assert_eq!(uploads(&h), 0, "an upload over the limit reached the disk");
    // Under the limit, the same path writes the file (so the count above can see one).
    assert_eq!(exchange(addr, &request("POST", Some(TOKEN), &[b'x'; 1000])).0, 422);
    assert_eq!(uploads(&h), 1);
}

#[test]
fn a_slow_head_a_slow_body_and_an_idle_keep_alive_connection_are_cut_off() {
    let h = Harness::new(plugins::COUNTER_V1);
    let limits = AdminLimits { head_read_ms_max: 300, body_read_ms_max: 300, ..AdminLimits::default() };
    let (_server, addr) = serve_tcp(&h, limits);

    // A head sent a byte every 50 ms never completes within 300 ms: the server closes
    // the connection, and the writes start failing.
    let mut slow = connect(addr);
    let head = format!("GET /plugin HTTP/1.1\r\nauthorization: Bearer {TOKEN}\r\nx-padding: {}", "x".repeat(200));
    let cut_after = head.bytes().position(|b| {
        std::thread::sleep(Duration::from_millis(50));
        slow.write_all(&[b]).is_err()
    });
    assert!(matches!(cut_after, Some(n) if n < 40), "a head trickling in was not cut off in 2 s: {cut_after:?}");

    // A body that stops half-way gets 408.
    let mut stream = connect(addr);
    let request_head =
        format!("POST /plugin HTTP/1.1\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: 100\r\n\r\n0123456789");
    stream.write_all(request_head.as_bytes()).unwrap();
    let (status, body) = read_response(&mut stream);
    assert_eq!(status, 408, "{body}");

    // A keep-alive connection left idle after its answer is closed.
    let mut stream = connect(addr);
    stream.write_all(&request("GET", Some(TOKEN), b"")).unwrap();
    assert_eq!(read_response(&mut stream).0, 200);
    assert!(closed_by_server(&mut stream), "an idle keep-alive connection stayed open");
}

#[test]
fn a_client_that_sends_requests_but_never_reads_the_answers_is_cut_off() {
    let h = Harness::new(plugins::COUNTER_V1);
    let limits = AdminLimits { write_stall_ms_max: 300, ..AdminLimits::default() };
    let (_server, addr) = serve_tcp(&h, limits);
    // Pipelined requests, no token (each answered with a 401), and no reading: once the
    // socket buffers are full the server's writes wait on the client.
    let mut stream = connect(addr);
    let requests = b"GET /plugin HTTP/1.1\r\n\r\n".repeat(40_000);
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Until the server closes the connection (or 400 MB, which no buffer holds).
        let written = (0..400).take_while(|_| stream.write_all(&requests).is_ok()).count();
        let _ = done.send(written);
    });
    let written = ended.recv_timeout(Duration::from_secs(30)).expect("the connection was still open after 30 s");
    assert!(written < 400, "the server read 400 MB of requests without closing the connection");
}
