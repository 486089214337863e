//! The admin endpoint: an HTTP/1.1 server (hyper, on a tokio current-thread runtime on
//! a thread of its own) that reports the running plugin and accepts a new version for
//! hot load, and serves the pipeline's metrics. It owns its listener and, for a Unix
//! socket, the socket file; its connections and their limits (`AdminLimits`); and the
//! uploads directory. `AdminServer` is the handle: dropping it stops the server and
//! joins its thread.
//!
//! - `GET /plugin`: the running plugin, the batch it runs from, the swaps so far and
//!   the last refusal, as JSON; for a Kafka run, that of each partition the process
//!   runs (`{"newest": ..., "partitions": [{"partition": N, ...}]}`).
//! - `POST /plugin` with the component as the body: compiled, instantiated and
//!   initialised here (off the processing path), then offered to the run's
//!   `SwapTarget`: each pipeline (each partition of a Kafka run) checks it against its
//!   stored state and swaps at a batch boundary of its own. 202 when queued, 422 with
//!   the reason when the component is refused, 503 when a pipeline has too many
//!   versions waiting.
//! - `GET /metrics`: the metrics (`metrics.rs`) in Prometheus's text format 0.0.4.
//!
//! Who may use it: on a Unix socket (`--admin unix`: `admin.sock` in the state dir)
//! the file's mode, 0600, lets only the user running the pipeline connect. A TCP
//! listener, loopback included, needs a token, because any local user can reach a
//! loopback port; every request must then carry `Authorization: Bearer <token>`. A
//! token given with a socket is required there too.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::hot_swap::{OfferError, PluginStatus, SwapTarget, TargetStatus};
use crate::metrics::Metrics;

/// The socket's file name in the state dir, for `--admin unix`.
pub const SOCKET_FILE: &str = "admin.sock";
/// Uploaded files kept; older ones are deleted (a loaded plugin no longer needs its
/// file, and the compile cache keeps what a swap back needs).
const UPLOADS_KEPT: usize = 8;
/// How long a stopping server waits for an upload being compiled on a blocking thread;
/// the connections themselves are dropped at once.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// A Unix socket's path, in bytes, is below this (Linux's `sun_path` holds 108 with the
/// final NUL); the staging path `bind_unix` binds is up to 10 bytes longer than the
/// final one.
const SOCKET_PATH_BYTES_MAX: usize = 108;
/// The pause after a failed `accept` (out of file descriptors, say), so that the
/// accept loop does not spin on an error that persists.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The endpoint's limits: what a client can make the host hold, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
    /// Time a client gets to send a request head (request line and headers), counted
    /// from the start of the connection or the end of the previous response: it is
    /// also how long an idle keep-alive connection stays open.
    pub head_read_ms_max: u64,
    /// Bytes of a request head; more is answered with 431.
    pub head_bytes_max: usize,
    /// Time a client gets to send a request body once its head is in; then 408.
    pub body_read_ms_max: u64,
    /// Bytes of an uploaded component; more is answered with 413, before the body is
    /// read when the request declares its length, and as soon as the count passes it
    /// otherwise. Nothing is written to disk before the whole body is in.
    pub body_bytes_max: u64,
    /// Time an answer may wait on a client that does not read it; then the connection
    /// is closed. Without it, a client that sends requests and never reads the answers
    /// would hold its connection for good once the socket buffers are full.
    pub write_stall_ms_max: u64,
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            connections_max: 16,
            head_read_ms_max: 10_000,
            head_bytes_max: 16 << 10,
            body_read_ms_max: 60_000,
            body_bytes_max: 64 << 20,
            write_stall_ms_max: 10_000,
        }
    }
}

/// Where the endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A Unix domain socket at this path, mode 0600.
    Unix(PathBuf),
    /// A TCP address; needs a token, loopback included.
    Tcp(SocketAddr),
}

impl Listen {
    /// Parses `--admin`: `unix` (the socket `admin.sock` in `state_dir`), `unix:PATH`,
    /// or `IP:PORT`.
    pub fn parse(spec: &str, state_dir: &Path) -> Result<Self, AdminError> {
        if spec == "unix" {
            return Ok(Self::Unix(state_dir.join(SOCKET_FILE)));
        }
        if let Some(path) = spec.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        spec.parse().map(Self::Tcp).map_err(|_| AdminError::BadListen(spec.to_owned()))
    }

    /// Refuses a token that cannot protect the endpoint: an empty one, or none on TCP.
    /// `serve` checks this too; the CLI calls it before opening the pipeline, so a
    /// wrong flag fails at once.
    pub fn check_token(&self, token: Option<&str>) -> Result<(), AdminError> {
        match (self, token) {
            (_, Some("")) => Err(AdminError::EmptyToken),
            (Self::Tcp(addr), None) => Err(AdminError::TokenRequired(*addr)),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(addr) => write!(f, "http://{addr}"),
        }
    }
}

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// `--admin` is neither `unix`, `unix:PATH` nor `IP:PORT`.
    #[error("--admin takes unix, unix:PATH or IP:PORT (such as 127.0.0.1:7070), not {0:?}")]
    BadListen(String),
    /// A TCP address without a token.
    #[error(
        "admin endpoint on {0}: a TCP address, loopback included, needs --admin-token (or GROUPSTATE_ADMIN_TOKEN); or use --admin unix for a socket only this user can open"
    )]
    TokenRequired(SocketAddr),
    /// An empty token.
    #[error(
        "admin endpoint: the token is empty: give a non-empty --admin-token (or GROUPSTATE_ADMIN_TOKEN), or unset it and use --admin unix"
    )]
    EmptyToken,
    /// The socket path holds something else.
    #[error("admin endpoint: {0} exists and is not a socket: remove it, or choose another path with --admin unix:PATH")]
    NotASocket(PathBuf),
    /// The socket path is too long for a Unix socket.
    #[error(
        "admin endpoint: the socket path {0} is too long for a Unix socket (about 95 bytes at most): choose a shorter one with --admin unix:PATH"
    )]
    SocketPathTooLong(PathBuf),
    /// The socket path holds a socket that a running server answers on.
    #[error(
        "admin endpoint: {0} is in use by a running server: stop it, or choose another path with --admin unix:PATH"
    )]
    SocketInUse(PathBuf),
    /// Binding failed.
    #[error("admin endpoint: cannot listen on {listen}: {cause}")]
    Bind {
        /// Where.
        listen: String,
        /// The error.
        cause: std::io::Error,
    },
    /// The runtime or the thread could not be made.
    #[error("admin endpoint: cannot start: {0}")]
    Start(std::io::Error),
}

/// What the endpoint needs from the run.
pub struct Admin {
    /// What `/plugin` reports and loads into.
    pub plugin: PluginTarget,
    /// The metrics `GET /metrics` renders, updated by whoever runs the batch loop.
    pub metrics: Arc<Metrics>,
    /// The bearer token, if any; required on TCP.
    pub token: Option<String>,
    /// Connections, timeouts and sizes.
    pub limits: AdminLimits,
}

/// Where `POST /plugin` offers uploads, and whose status `GET /plugin` reports.
pub struct PluginTarget {
    /// Where uploads are written before they are offered.
    pub upload_dir: PathBuf,
    /// The run's pipelines: one, or a Kafka run's partitions.
    pub target: Arc<dyn SwapTarget>,
}

/// The running endpoint. Dropping it stops the server, joins its thread and removes
/// its socket file.
pub struct AdminServer {
    listen: Listen,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    // Declared after `thread`, so dropped after the thread is joined.
    _socket: Option<SocketFile>,
}

impl AdminServer {
    /// Where it listens (with the port bound for `IP:0`).
    pub fn listen(&self) -> &Listen {
        &self.listen
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the thread has ended already; the join below returns at once.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the admin thread has been printed there; the pipeline goes on.
            let _ = thread.join();
        }
    }
}

/// Starts the endpoint on its own thread.
pub fn serve(listen: Listen, mut admin: Admin) -> Result<AdminServer, AdminError> {
    listen.check_token(admin.token.as_deref())?;
    // Only the digest is kept.
    let token = admin.token.take().as_deref().map(TokenDigest::new);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(AdminError::Start)?;
    let (listener, bound, socket) = {
        // tokio's listeners register with the reactor of the runtime they are made in.
        let _context = runtime.enter();
        Listener::bind(&listen)?
    };
    let shared = Arc::new(Shared { limits: admin.limits, token, admin, uploading: Semaphore::new(1) });
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("groupstate-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let accepting = tokio::spawn(accept_loop(listener, shared));
                // Sent by the handle's drop; a dropped sender ends the server as well.
                let _ = stopped.await;
                accepting.abort();
            });
            runtime.shutdown_timeout(SHUTDOWN_WAIT);
        })
        .map_err(AdminError::Start)?;
    Ok(AdminServer { listen: bound, stop: Some(stop), thread: Some(thread), _socket: socket })
}

/// What every connection shares.
struct Shared {
    admin: Admin,
    limits: AdminLimits,
    token: Option<TokenDigest>,
    /// One upload at a time: each holds up to `body_bytes_max` in memory, and
    /// compiling takes the machine's cores anyway.
    uploading: Semaphore,
}

/// The token, kept as its SHA-256 digest and compared in constant time: the
/// comparison takes as long whatever the given token, so its timing tells a client
/// nothing about how much of a guess was right. Hashing first makes the lengths equal,
/// and what is compared is a digest no client can steer byte by byte.
struct TokenDigest([u8; 32]);

impl TokenDigest {
    fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        let diff = self.0.iter().zip(&given).fold(0u8, |diff, (a, b)| diff | (a ^ b));
        // `black_box` keeps the optimiser from turning the fold into an early exit.
        std::hint::black_box(diff) == 0
    }
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// Binds; returns the listener, where it is bound and, for a socket, its file.
    fn bind(listen: &Listen) -> Result<(Self, Listen, Option<SocketFile>), AdminError> {
        let bind_error = |cause| AdminError::Bind { listen: listen.to_string(), cause };
        match listen {
            Listen::Tcp(addr) => {
                let blocking = std::net::TcpListener::bind(addr).map_err(bind_error)?;
                blocking.set_nonblocking(true).map_err(bind_error)?;
                let bound = blocking.local_addr().map_err(bind_error)?;
                let listener = tokio::net::TcpListener::from_std(blocking).map_err(bind_error)?;
                Ok((Self::Tcp(listener), Listen::Tcp(bound), None))
            }
            Listen::Unix(path) => {
                let (blocking, file) = bind_unix(path)?;
                blocking.set_nonblocking(true).map_err(bind_error)?;
                let listener = tokio::net::UnixListener::from_std(blocking).map_err(bind_error)?;
                Ok((Self::Unix(listener), listen.clone(), Some(file)))
            }
        }
    }
}

/// The socket file of a Unix listener, removed when the server stops unless another
/// file has taken its place meanwhile.
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            // Best effort: a file that cannot be removed is found stale at the next start.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds a socket at `path` with mode 0600, replacing a stale one.
fn bind_unix(path: &Path) -> Result<(std::os::unix::net::UnixListener, SocketFile), AdminError> {
    let bind_error = |cause| AdminError::Bind { listen: format!("unix:{}", path.display()), cause };
    remove_stale_socket(path)?;
    // The socket is bound in a private directory and moved into place once its mode is
    // 0600, so there is no moment at which another user could connect: the backlog
    // would keep such a connection, to be served later.
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let private = parent.join(format!(".admin-{}.tmp", std::process::id()));
    // A leftover of an earlier run that had the same process id.
    let _ = std::fs::remove_dir_all(&private);
    let staged = private.join("s");
    if staged.as_os_str().len() >= SOCKET_PATH_BYTES_MAX {
        return Err(AdminError::SocketPathTooLong(path.to_owned()));
    }
    std::fs::DirBuilder::new().mode(0o700).create(&private).map_err(bind_error)?;
    let placed = std::os::unix::net::UnixListener::bind(&staged).and_then(|listener| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_dir_all(&private);
    let listener = placed.map_err(bind_error)?;
    let meta = std::fs::symlink_metadata(path).map_err(bind_error)?;
    Ok((listener, SocketFile { path: path.to_owned(), dev: meta.dev(), ino: meta.ino() }))
}

/// Removes a socket left at `path` by a run that did not stop cleanly; refuses a file
/// that is not a socket, and a socket that a running server answers on.
fn remove_stale_socket(path: &Path) -> Result<(), AdminError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        return Err(AdminError::NotASocket(path.to_owned()));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(AdminError::SocketInUse(path.to_owned()));
    }
    std::fs::remove_file(path).map_err(|cause| AdminError::Bind { listen: format!("unix:{}", path.display()), cause })
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    let open = Arc::new(Semaphore::new(shared.limits.connections_max));
    loop {
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        };
        let Ok(stream) = accepted else {
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        // Past the limit a connection is closed at once (dropped here): its client
        // learns it straight away, and the connections being served keep theirs.
        let Ok(permit) = open.clone().try_acquire_owned() else { continue };
        let shared = shared.clone();
        match stream {
            Stream::Tcp(s) => tokio::spawn(serve_connection(s, shared, permit)),
            Stream::Unix(s) => tokio::spawn(serve_connection(s, shared, permit)),
        };
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Serves one connection (keep-alive: requests one after another) until the client
/// closes it or a limit ends it; the permit counts it as open until then.
async fn serve_connection<S>(stream: S, shared: Arc<Shared>, _open: OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = shared.limits;
    let service = hyper::service::service_fn(move |request| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(respond(request, &shared).await) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.head_read_ms_max))
        .max_header_size(limits.head_bytes_max)
        // The answers are JSON for a script or a person; a date header would say nothing.
        .auto_date_header(false);
    let stream = WriteStallLimit::new(stream, Duration::from_millis(limits.write_stall_ms_max));
    // A connection that fails (timed out, reset, malformed) is its client's to retry.
    // It is not logged, so that no client can fill the host's log.
    let _ = http.serve_connection(TokioIo::new(stream), service).await;
}

/// A stream whose writes fail with `TimedOut` once they have waited `limit` on a peer
/// that reads nothing. hyper has timeouts for reading a request but none for writing
/// an answer.
struct WriteStallLimit<S> {
    inner: S,
    limit: Duration,
    /// Armed when a write finds the peer's buffers full; disarmed by any progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteStallLimit<S> {
    fn new(inner: S, limit: Duration) -> Self {
        Self { inner, limit, stalled: None }
    }

    /// Turns a `Pending` write into `TimedOut` once the stall has lasted `limit`.
    fn stall<T>(&mut self, progress: Poll<std::io::Result<T>>, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        if progress.is_ready() {
            self.stalled = None;
            return progress;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let message = format!("the client read nothing for {} ms", limit.as_millis());
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, message)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStallLimit<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStallLimit<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let progress = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stall(progress, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let progress = Pin::new(&mut self.inner).poll_flush(cx);
        self.stall(progress, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let progress = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.stall(progress, cx)
    }
}

type Reply = Response<Full<Bytes>>;

async fn respond(request: Request<Incoming>, shared: &Arc<Shared>) -> Reply {
    if let Some(token) = &shared.token {
        let authorization = request.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes);
        let given = authorization.and_then(|a| a.strip_prefix(b"Bearer "));
        if !given.is_some_and(|g| token.matches(g)) {
            let mut reply = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
            reply.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            // A client without the token gets one answer per connection: it cannot keep
            // a connection (one of `connections_max`) open with requests it may not make.
            reply.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return reply;
        }
    }
    match request.uri().path() {
        "/plugin" => plugin(request, shared).await,
        "/metrics" if *request.method() == Method::GET => metrics(&shared.admin.metrics),
        "/metrics" => not_allowed("use GET /metrics", "GET"),
        _ => error(StatusCode::NOT_FOUND, "use GET /plugin, POST /plugin or GET /metrics"),
    }
}

async fn plugin(request: Request<Incoming>, shared: &Arc<Shared>) -> Reply {
    match *request.method() {
        Method::GET => json(StatusCode::OK, status_json(&shared.admin.plugin.target.status())),
        Method::POST => upload(request, shared).await,
        _ => not_allowed("use GET /plugin or POST /plugin", "GET, POST"),
    }
}

fn not_allowed(message: &str, allow: &'static str) -> Reply {
    let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, message);
    reply.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    reply
}

fn metrics(metrics: &Metrics) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(metrics.render())));
    reply.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::metrics::CONTENT_TYPE));
    reply
}

fn status_json(status: &TargetStatus) -> serde_json::Value {
    match status {
        TargetStatus::Pipeline(s) => pipeline_json(s),
        TargetStatus::Partitions { newest, partitions } => {
            let partitions: Vec<_> = partitions
                .iter()
                .map(|(partition, s)| {
                    let mut entry = pipeline_json(s);
                    entry["partition"] = serde_json::json!(partition);
                    entry
                })
                .collect();
            serde_json::json!({ "newest": newest, "partitions": partitions })
        }
    }
}

/// One pipeline's status: what it runs since which batch, its swaps, its last refusal
/// and the candidate under its migration check.
fn pipeline_json(s: &PluginStatus) -> serde_json::Value {
    let swaps: Vec<_> =
        s.swaps.iter().map(|(b, from, to)| serde_json::json!({ "batch": b, "from": from, "to": to })).collect();
    serde_json::json!({
        "running": s.running, "since_batch": s.since_batch, "swaps": swaps, "last_refusal": s.last_refusal,
        "checking": s.checking,
    })
}

async fn upload(request: Request<Incoming>, shared: &Arc<Shared>) -> Reply {
    let limit = shared.limits.body_bytes_max;
    // A declared length (Content-Length) over the limit is refused before the body is read.
    if request.body().size_hint().lower() > limit {
        return too_large(limit);
    }
    let Ok(_uploading) = shared.uploading.try_acquire() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "another upload is in progress: retry once it is answered");
    };
    let body_time = Duration::from_millis(shared.limits.body_read_ms_max);
    let bytes = match tokio::time::timeout(body_time, read_body(request.into_body(), limit)).await {
        Err(_) => {
            let message = format!("the body did not arrive within {} ms: send it faster", body_time.as_millis());
            return error(StatusCode::REQUEST_TIMEOUT, &message);
        }
        Ok(Err(reply)) => return reply,
        Ok(Ok(bytes)) => bytes,
    };
    // Writing the file and compiling block, so they run off the server's one thread;
    // the other connections are served meanwhile.
    let shared = shared.clone();
    match tokio::task::spawn_blocking(move || store_and_load(&bytes, &shared.admin)).await {
        Ok(reply) => reply,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("loading the upload failed: {e}")),
    }
}

/// Reads a body of at most `limit` bytes, counting as it goes.
async fn read_body(mut body: Incoming, limit: u64) -> Result<Vec<u8>, Reply> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if (bytes.len() + data.len()) as u64 > limit {
            return Err(too_large(limit));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes)
}

fn too_large(limit: u64) -> Reply {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the component is over {limit} bytes"))
}

/// Writes the upload and offers it (blocking: the target loads it).
fn store_and_load(bytes: &[u8], admin: &Admin) -> Reply {
    let admin = &admin.plugin;
    let sha = crate::plugin::sha256_hex(bytes);
    let path = admin.upload_dir.join(format!("upload-{sha}.wasm"));
    let written = std::fs::create_dir_all(&admin.upload_dir).and_then(|()| std::fs::write(&path, bytes));
    if let Err(e) = written {
        return error(StatusCode::SERVICE_UNAVAILABLE, &format!("cannot store the upload: {e}"));
    }
    prune_uploads(&admin.upload_dir);
    match admin.target.offer(&path, &format!("admin upload {sha}")) {
        Ok(offered) => {
            let info = offered.info;
            let mut reply = serde_json::json!({
                "queued": { "name": info.name, "version": info.version, "state_schema_version": info.state_schema_version },
                "sha256": sha,
                "swap": "at the next batch boundary, after its state check; GET /plugin shows the outcome",
            });
            if let Some(partitions) = offered.partitions {
                reply["partitions"] = serde_json::json!(partitions);
                reply["swap"] = serde_json::json!(
                    "each partition at a batch boundary of its own, after its own state check; a partition assigned later opens with it; GET /plugin shows the outcome"
                );
            }
            json(StatusCode::ACCEPTED, reply)
        }
        Err(OfferError::Refused(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, &e),
        Err(OfferError::Busy(e)) => error(StatusCode::SERVICE_UNAVAILABLE, &e),
    }
}

fn json(status: StatusCode, body: serde_json::Value) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(body.to_string())));
    *reply.status_mut() = status;
    reply.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

fn error(status: StatusCode, message: &str) -> Reply {
    json(status, serde_json::json!({ "error": message }))
}

/// Deletes all but the newest `UPLOADS_KEPT` uploads. Best effort: a file that cannot be
/// listed or removed stays.
fn prune_uploads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut uploads: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("upload-"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    uploads.sort();
    let excess = uploads.len().saturating_sub(UPLOADS_KEPT);
    for (_, path) in uploads.into_iter().take(excess) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_itself_only() {
        let token = TokenDigest::new("s3cret-token");
        assert!(token.matches(b"s3cret-token"));
        for wrong in ["s3cret-tokex", "s3cret-toke", "s3cret-token ", "", "S3CRET-TOKEN"] {
            assert!(!token.matches(wrong.as_bytes()), "{wrong:?} matched");
        }
    }

    #[test]
    fn listen_parses_the_three_forms_and_refuses_the_rest() {
        let dir = Path::new("/var/lib/gs");
        assert_eq!(Listen::parse("unix", dir).unwrap(), Listen::Unix(dir.join("admin.sock")));
        assert_eq!(Listen::parse("unix:/run/a.sock", dir).unwrap(), Listen::Unix("/run/a.sock".into()));
        assert_eq!(Listen::parse("127.0.0.1:7070", dir).unwrap(), Listen::Tcp("127.0.0.1:7070".parse().unwrap()));
        for bad in ["unix:", "localhost:7070", "7070", ""] {
            let err = Listen::parse(bad, dir).unwrap_err().to_string();
            assert!(err.contains("--admin takes unix, unix:PATH or IP:PORT"), "{err}");
        }
    }

    #[test]
    fn tcp_needs_a_token_and_no_listener_takes_an_empty_one() {
        let tcp = Listen::Tcp("127.0.0.1:7070".parse().unwrap());
        let unix = Listen::Unix("/tmp/a.sock".into());
        assert!(matches!(tcp.check_token(None), Err(AdminError::TokenRequired(_))));
        assert!(matches!(tcp.check_token(Some("")), Err(AdminError::EmptyToken)));
        assert!(matches!(unix.check_token(Some("")), Err(AdminError::EmptyToken)));
        assert!(tcp.check_token(Some("t")).is_ok());
        assert!(unix.check_token(None).is_ok());
    }
}
