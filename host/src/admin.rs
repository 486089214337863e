//! The admin endpoint: a small HTTP/1.1 server on tokio that reports the running plugin
//! and accepts a new version for hot load. It listens on loopback unless a token is
//! set; with a token, every request must carry `Authorization: Bearer <token>`.
//!
//! - `GET /plugin`: the running plugin, the batch it runs from, the swaps so far and
//!   the last refusal, as JSON.
//! - `POST /plugin` with the component as the body: compiled, instantiated and
//!   initialised here (off the processing path), then queued; the pipeline checks it
//!   against the stored state and swaps at the next batch boundary. 202 when queued,
//!   422 with the reason when the component is refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::pipeline::{Candidate, PluginStatus, SwapSender};
use crate::plugin::Runtime;

/// Request head (request line and headers) size limit.
const HEAD_BYTES_MAX: usize = 16 << 10;
/// Uploaded component size limit.
const BODY_BYTES_MAX: usize = 64 << 20;
/// Uploaded files kept; older ones are deleted (a loaded plugin no longer needs its
/// file, and the compile cache keeps what a swap back needs).
const UPLOADS_KEPT: usize = 8;
/// Time a client gets to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A non-loopback address without a token.
    #[error("admin endpoint on {0}: a non-loopback address needs --admin-token, or bind it to 127.0.0.1")]
    TokenRequired(SocketAddr),
    /// Binding failed.
    #[error("admin endpoint: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// What the endpoint needs from the pipeline.
pub struct Admin {
    /// Compiles uploads.
    pub runtime: Arc<Runtime>,
    /// The plugin's `init` parameters.
    pub params: Vec<(String, String)>,
    /// Where uploads are written before they are loaded.
    pub upload_dir: PathBuf,
    /// Queues candidates.
    pub sender: SwapSender,
    /// The pipeline's plugin status.
    pub status: Arc<Mutex<PluginStatus>>,
    /// The bearer token, if any.
    pub token: Option<String>,
}

/// Starts the endpoint on its own thread; returns the bound address.
pub fn serve(addr: SocketAddr, admin: Admin) -> Result<SocketAddr, AdminError> {
    if !addr.ip().is_loopback() && admin.token.is_none() {
        return Err(AdminError::TokenRequired(addr));
    }
    let bind = |source| AdminError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let bound = listener.local_addr().map_err(bind)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(bind)?;
    std::thread::Builder::new()
        .name("groupstate-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return eprintln!("groupstate: admin endpoint stopped: {e}"),
                };
                // One connection at a time: an admin endpoint needs no concurrency, and
                // this bounds what a client can make the host hold.
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    match tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, &admin)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => eprintln!("groupstate: admin request failed: {e}"),
                        Err(_) => eprintln!("groupstate: admin request timed out"),
                    }
                }
            });
        })
        .map_err(bind)?;
    Ok(bound)
}

struct Request {
    method: String,
    path: String,
    authorization: Option<String>,
    body: Vec<u8>,
}

/// Reads one request; `Err` carries the status and message to answer with.
async fn read_request(stream: &mut TcpStream) -> Result<Request, (u16, String)> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > HEAD_BYTES_MAX {
            return Err((431, format!("request head over {HEAD_BYTES_MAX} bytes")));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.map_err(|e| (400, e.to_string()))?;
        if n == 0 {
            return Err((400, "connection closed before the request ended".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| (400, "request head is not UTF-8".to_owned()))?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (first.next().unwrap_or_default().to_owned(), first.next().unwrap_or_default().to_owned());
    let (mut length, mut authorization) = (0usize, None);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                length = value.trim().parse().map_err(|_| (400, "bad content-length".to_owned()))?;
            }
            "authorization" => authorization = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    if length > BODY_BYTES_MAX {
        return Err((413, format!("body of {length} bytes is over {BODY_BYTES_MAX}")));
    }
    let mut body = buf[head_end + 4..].to_vec();
    body.truncate(length);
    while body.len() < length {
        let mut chunk = vec![0u8; (length - body.len()).min(1 << 16)];
        let n = stream.read(&mut chunk).await.map_err(|e| (400, e.to_string()))?;
        if n == 0 {
            return Err((400, "connection closed before the body ended".into()));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Request { method, path, authorization, body })
}

async fn handle(mut stream: TcpStream, admin: &Admin) -> std::io::Result<()> {
    let (status, body) = match read_request(&mut stream).await {
        Err((status, message)) => (status, serde_json::json!({ "error": message })),
        Ok(req) => route(req, admin),
    };
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        202 => "Accepted",
        401 => "Unauthorized",
        404 => "Not Found",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Bad Request",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn route(req: Request, admin: &Admin) -> (u16, serde_json::Value) {
    if let Some(token) = &admin.token {
        let given = req.authorization.as_deref().and_then(|a| a.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return (401, serde_json::json!({ "error": "missing or wrong bearer token" }));
        }
    }
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/plugin") => {
            let s = admin.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let swaps: Vec<_> =
                s.swaps.iter().map(|(b, from, to)| serde_json::json!({ "batch": b, "from": from, "to": to })).collect();
            (
                200,
                serde_json::json!({
                    "running": s.running, "since_batch": s.since_batch, "swaps": swaps, "last_refusal": s.last_refusal,
                }),
            )
        }
        ("POST", "/plugin") => upload(&req.body, admin),
        _ => (404, serde_json::json!({ "error": "use GET /plugin or POST /plugin" })),
    }
}

fn upload(bytes: &[u8], admin: &Admin) -> (u16, serde_json::Value) {
    let sha = crate::plugin::sha256_hex(bytes);
    let path = admin.upload_dir.join(format!("upload-{sha}.wasm"));
    let written = std::fs::create_dir_all(&admin.upload_dir).and_then(|()| std::fs::write(&path, bytes));
    if let Err(e) = written {
        return (503, serde_json::json!({ "error": format!("cannot store the upload: {e}") }));
    }
    prune_uploads(&admin.upload_dir);
    let plugin = match admin.runtime.load(&path, &admin.params) {
        Ok(p) => p,
        Err(e) => return (422, serde_json::json!({ "error": e.to_string() })),
    };
    let info = plugin.info().clone();
    let candidate = Candidate { plugin: Box::new(plugin), origin: format!("admin upload {sha}") };
    match admin.sender.send(candidate) {
        Ok(()) => (
            202,
            serde_json::json!({
                "queued": { "name": info.name, "version": info.version, "state_schema_version": info.state_schema_version },
                "sha256": sha,
                "swap": "at the next batch boundary, after its state check; GET /plugin shows the outcome",
            }),
        ),
        Err(e) => (503, serde_json::json!({ "error": e })),
    }
}

/// Deletes all but the newest `UPLOADS_KEPT` uploads. Best effort: a file that cannot be
/// listed or removed stays.
fn prune_uploads(dir: &std::path::Path) {
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
