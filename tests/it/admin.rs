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
        plugin: groupstate::admin::PluginTarget {
            upload_dir: h.dir.path().join("uploads"),
            target: std::sync::Arc::new(h.pipeline.swap_target().unwrap()),
        },
        metrics: std::sync::Arc::default(),
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

/// A GET of `path` with the token (if any) on a fresh connection: the status, the
/// head and the body as text.
fn get_text(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut stream = connect(addr);
    let mut request = format!("GET {path} HTTP/1.1\r\nhost: groupstate\r\nconnection: close\r\n");
    if let Some(token) = token {
        request.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// The samples of a Prometheus text rendering, `name{labels}` to value; every sample's
/// family must have its `# TYPE` line before it.
fn parse_metrics(text: &str) -> std::collections::HashMap<String, f64> {
    let mut typed = std::collections::HashSet::new();
    let mut samples = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(kind == "counter" || kind == "gauge", "{line}");
            typed.insert(name.to_owned());
        } else if !line.starts_with("# HELP ") {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            assert!(typed.contains(name), "{series} comes before its # TYPE line");
            assert!(samples.insert(series.to_owned(), value.parse().unwrap()).is_none(), "{series} twice");
        }
    }
    samples
}

/// The lines of a file (none if it does not exist).
fn line_count(path: &std::path::Path) -> f64 {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count()) as f64
}

/// `groupstate state --show WHAT` of a state dir: its JSON lines.
fn state_lines(state: &std::path::Path, show: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(crate::cli::groupstate_bin())
        .args(["state", "--state-dir", state.to_str().unwrap(), "--show", show])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A `groupstate run --follow` of the sensor plugin with the admin endpoint on TCP,
/// killed when dropped.
struct Following {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Following {
    fn start(dir: &std::path::Path, input: &std::path::Path, log: &str) -> Self {
        let p = |name: &str| dir.join(name).display().to_string();
        let mut args = crate::cli::sensor_run_args(input.to_str().unwrap(), &p("out.jsonl"), &p("state"));
        args.extend(
            [
                "--batch-events",
                "5000",
                "--follow",
                "--trigger-interval-ms",
                "20",
                "--admin",
                "127.0.0.1:0",
                "--no-fsync",
            ]
            .map(String::from),
        );
        let log_path = dir.join(log);
        let mut child = std::process::Command::new(crate::cli::groupstate_bin())
            .args(&args)
            .env("GROUPSTATE_ADMIN_TOKEN", TOKEN)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        // The port it bound, from its log (looked for every 20 ms, for a minute at most).
        let mut log = String::new();
        for _ in 0..3000 {
            log = std::fs::read_to_string(&log_path).unwrap();
            if let Some(rest) = log.split("admin endpoint on http://").nth(1) {
                let addr = rest.split(' ').next().unwrap().parse().unwrap();
                return Self { child, addr };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("no admin endpoint in a minute: {log}");
    }

    /// The metrics once the run has read `records` records and committed nothing more
    /// for a while (the batch that fires the last timers comes right after the last
    /// batch of data, with no trigger interval between).
    fn settled_metrics(&self, records: f64) -> std::collections::HashMap<String, f64> {
        let mut last: Option<std::collections::HashMap<String, f64>> = None;
        // Every 300 ms, for a minute at most.
        for _ in 0..200 {
            let (status, head, body) = get_text(self.addr, "/metrics", Some(TOKEN));
            assert_eq!(status, 200, "{head}\n{body}");
            assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
            let metrics = parse_metrics(&body);
            let batches = |m: &std::collections::HashMap<String, f64>| m["groupstate_batches_total{partition=\"0\"}"];
            if metrics["groupstate_input_records_total{partition=\"0\"}"] == records
                && last.as_ref().is_some_and(|l| batches(l) == batches(&metrics))
            {
                return metrics;
            }
            last = Some(metrics);
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("the run did not settle in a minute: {last:?}");
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks the metrics of one run against the state dir, the outputs, and the run
/// before it (`before`: batches, records, events, outputs, late and dead letters
/// committed by earlier runs, from the checkpoint).
fn check_against_the_state(metrics: &std::collections::HashMap<String, f64>, dir: &std::path::Path, before: [f64; 6]) {
    let m = |name: &str| *metrics.get(&format!("{name}{{partition=\"0\"}}")).unwrap_or_else(|| panic!("no {name}"));
    let state = dir.join("state");
    let checkpoint = &state_lines(&state, "checkpoint")[0];
    let c = &checkpoint["counters"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as f64;
    let [batches, records, events, outputs, late, dead_letters] = before;
    assert_eq!(m("groupstate_batches_total"), n(&checkpoint["next_batch_id"]) - batches);
    assert_eq!(m("groupstate_last_batch_id"), n(&checkpoint["next_batch_id"]) - 1.0);
    assert_eq!(m("groupstate_input_records_total"), n(&c["records"]) - records);
    assert_eq!(m("groupstate_events_total"), n(&c["events"]) - events);
    assert_eq!(m("groupstate_outputs_total"), line_count(&dir.join("out.jsonl")) - outputs);
    assert_eq!(m("groupstate_late_records_total"), line_count(&state.join("late.jsonl")) - late);
    assert_eq!(m("groupstate_dead_letters_total"), line_count(&state.join("dead-letter.jsonl")) - dead_letters);
    let calls = |kind: &str| metrics[&format!("groupstate_plugin_calls_total{{partition=\"0\",kind=\"{kind}\"}}")];
    assert!(calls("data") > 0.0 && calls("timeout") > 0.0, "{metrics:?}");
    assert_eq!(m("groupstate_keys"), state_lines(&state, "keys").len() as f64);
    assert_eq!(m("groupstate_timers"), state_lines(&state, "timers").len() as f64);
    assert_eq!(m("groupstate_watermark_seconds"), n(&checkpoint["watermark_ms"]) / 1000.0);
    // The batch's time covers the stages the batch loop waits for.
    let stage =
        |stage: &str| metrics[&format!("groupstate_last_batch_stage_seconds{{partition=\"0\",stage=\"{stage}\"}}")];
    let waited = stage("input_wait") + stage("state_load") + stage("plugin") + stage("commit");
    assert!(m("groupstate_last_batch_duration_seconds") >= waited && waited > 0.0, "{metrics:?}");
    assert!(metrics["groupstate_stage_seconds_total{partition=\"0\",stage=\"commit\"}"] >= stage("commit"));
    assert_eq!(m("groupstate_plugin_swaps_total"), 0.0);
}

#[test]
fn the_cli_serves_metrics_that_agree_with_what_the_run_did() {
    let dir = tempfile::tempdir().unwrap();
    let input = groupstate_tests::sensor_input(dir.path(), 20_000, 100, 4);
    // Three records that cannot be decoded, for the dead-letter counter.
    let mut text = std::fs::read_to_string(&input).unwrap();
    text.insert_str(text.find('\n').unwrap() + 1, "not json\n{\"ts\":1}\n[1]\n");
    std::fs::write(&input, &text).unwrap();
    let lines = text.lines().count() as f64;

    let run = Following::start(dir.path(), &input, "run1.log");
    // The token is required, on /metrics as on /plugin.
    assert_eq!(get_text(run.addr, "/metrics", None).0, 401);
    assert_eq!(get_text(run.addr, "/metrics", Some("s3cret-tokex")).0, 401);
    let post = format!("POST /metrics HTTP/1.1\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(exchange(run.addr, post.as_bytes()).0, 405);
    let metrics = run.settled_metrics(lines);
    drop(run);
    let m = |name: &str| metrics[&format!("{name}{{partition=\"0\"}}")];
    assert_eq!(m("groupstate_input_records_total"), 20_003.0);
    assert_eq!(m("groupstate_dead_letters_total"), 3.0);
    // 20 003 records in batches of 5 000, and perhaps one more that fires the timers
    // the final watermark passed (the checkpoint's count is checked below).
    let batches = m("groupstate_batches_total");
    assert!(batches == 5.0 || batches == 6.0, "{batches} batches");
    assert!(m("groupstate_keys") > 0.0 && m("groupstate_keys") <= 100.0, "{metrics:?}");
    check_against_the_state(&metrics, dir.path(), [0.0; 6]);

    // A second run over the same state dir starts its keys and timers from the store
    // and moves them with its batches: 50 new sensors, later than all the rest.
    let checkpoint = &state_lines(&dir.path().join("state"), "checkpoint")[0];
    let c = &checkpoint["counters"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as f64;
    let before = [
        n(&checkpoint["next_batch_id"]),
        n(&c["records"]),
        n(&c["events"]),
        line_count(&dir.path().join("out.jsonl")),
        line_count(&dir.path().join("state").join("late.jsonl")),
        line_count(&dir.path().join("state").join("dead-letter.jsonl")),
    ];
    let last_ts = n(&checkpoint["max_event_time_ms"]) as i64;
    let more: String = (0..50)
        .map(|i| {
            format!("{{\"sensor_id\":\"new-{i}\",\"ts\":{},\"status\":\"ok\",\"reading\":1.0}}\n", last_ts + 1000 * i)
        })
        .collect();
    let run = Following::start(dir.path(), &input, "run2.log");
    std::fs::OpenOptions::new().append(true).open(&input).unwrap().write_all(more.as_bytes()).unwrap();
    let metrics = run.settled_metrics(50.0);
    drop(run);
    check_against_the_state(&metrics, dir.path(), before);
}
