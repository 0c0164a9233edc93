//! The server side of a SPDY connection from kubectl: remote command channels (exec, attach,
//! cp) as streams named by their `streamType` header, and port-forward's pairs of error and data
//! streams, each data stream one TCP connection to a port of the pod.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::debug;

use crate::spdy::{self, CANCEL, Decoder, Encoder, FLAG_FIN, Frame, MAX_DATA_CHUNK, SpdyError};
use crate::streams::{ERROR, Outgoing, RESIZE, STDERR, STDIN, STDOUT, TransportEnds};

/// How long the client has to open the streams a session needs.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads frames off one connection; writes go through `tx` to a single writer task.
struct Connection<S> {
    reader: ReadHalf<S>,
    buf: BytesMut,
    decoder: Decoder,
    w: Writer,
}

/// The sending side of a connection: frames queued for its writer task.
#[derive(Clone)]
struct Writer {
    tx: mpsc::Sender<Frame>,
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> Connection<S> {
    fn start(io: S) -> Self {
        let (reader, mut writer) = tokio::io::split(io);
        let (tx, mut rx) = mpsc::channel::<Frame>(64);
        tokio::spawn(async move {
            let mut enc = Encoder::default();
            let mut out = BytesMut::with_capacity(64 * 1024);
            while let Some(frame) = rx.recv().await {
                out.clear();
                if let Err(e) = enc.encode(&frame, &mut out) {
                    debug!(error = %e, "encoding a SPDY frame failed");
                    break;
                }
                // Batch what is already queued into one write.
                while out.len() < 256 * 1024 {
                    match rx.try_recv() {
                        Ok(f) => {
                            if enc.encode(&f, &mut out).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
                if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });
        Connection { reader, buf: BytesMut::with_capacity(64 * 1024), decoder: Decoder::default(), w: Writer { tx } }
    }

    /// The next frame; `None` at the end of the connection. Cancel-safe.
    async fn next(&mut self) -> Result<Option<Frame>, SpdyError> {
        loop {
            if let Some(f) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(f));
            }
            match self.reader.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(_) => {}
            }
        }
    }

    /// Says goodbye and gives the client a moment to read what was sent and close its side.
    async fn finish(mut self) {
        let _ = self.w.send(Frame::GoAway { last_good: 0, status: 0 }).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(_)) = self.next().await {}
        })
        .await;
    }
}

impl Writer {
    async fn send(&self, frame: Frame) -> bool {
        self.tx.send(frame).await.is_ok()
    }

    /// Sends `data` on `stream_id` in frames of bounded size.
    async fn send_data(&self, stream_id: u32, data: &[u8], fin: bool) -> bool {
        let mut chunks = data.chunks(MAX_DATA_CHUNK).peekable();
        if chunks.peek().is_none() {
            return self.send(Frame::Data { stream_id, flags: if fin { FLAG_FIN } else { 0 }, data: Bytes::new() }).await;
        }
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none();
            let flags = if fin && last { FLAG_FIN } else { 0 };
            if !self.send(Frame::Data { stream_id, flags, data: Bytes::copy_from_slice(c) }).await {
                return false;
            }
        }
        true
    }

}

/// Which remote command streams a session expects, from its request's parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn channel_of(stream_type: &str) -> Option<u8> {
    Some(match stream_type {
        "stdin" => STDIN,
        "stdout" => STDOUT,
        "stderr" => STDERR,
        "error" => ERROR,
        "resize" => RESIZE,
        _ => return None,
    })
}

/// Carries remote command channels over SPDY (`v4.channel.k8s.io`) until the session finishes
/// or the client goes away.
pub(crate) async fn serve_channels<S>(io: S, want: Wanted, mut ends: TransportEnds)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = Connection::start(io);
    let mut ids: HashMap<u8, u32> = HashMap::new();
    let mut channels: HashMap<u32, u8> = HashMap::new();
    let ready = |ids: &HashMap<u8, u32>| {
        ids.contains_key(&ERROR)
            && (!want.stdin || ids.contains_key(&STDIN))
            && (!want.stdout || ids.contains_key(&STDOUT))
            && (!want.stderr || want.tty || ids.contains_key(&STDERR))
    };
    // The session runs once its streams exist; until then its output waits in the channel.
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    let mut resize_buf = Vec::new();
    loop {
        let streams_ready = ready(&ids);
        tokio::select! {
            frame = conn.next() => {
                let frame = match frame {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        debug!(error = %e, "SPDY session ended");
                        break;
                    }
                };
                match frame {
                    Frame::SynStream { stream_id, headers, .. } => {
                        let ch = spdy::header(&headers, "streamtype").and_then(channel_of);
                        match ch {
                            Some(ch) => {
                                ids.insert(ch, stream_id);
                                channels.insert(stream_id, ch);
                                conn.w.send(Frame::SynReply { stream_id, flags: 0, headers: vec![] }).await;
                            }
                            None => {
                                conn.w.send(Frame::RstStream { stream_id, status: CANCEL }).await;
                            }
                        }
                    }
                    Frame::Data { stream_id, flags, data } => {
                        match channels.get(&stream_id) {
                            Some(&RESIZE) => {
                                // Sizes arrive as newline-separated JSON documents.
                                resize_buf.extend_from_slice(&data);
                                while let Some(i) = resize_buf.iter().position(|b| *b == b'\n') {
                                    let line: Vec<u8> = resize_buf.drain(..=i).collect();
                                    ends.incoming(RESIZE, Bytes::from(line)).await;
                                }
                                if !resize_buf.is_empty() && serde_json::from_slice::<serde_json::Value>(&resize_buf).is_ok() {
                                    ends.incoming(RESIZE, Bytes::from(std::mem::take(&mut resize_buf))).await;
                                }
                            }
                            Some(&STDIN) => {
                                if !data.is_empty() {
                                    ends.incoming(STDIN, data).await;
                                }
                                if flags & FLAG_FIN != 0 {
                                    ends.close_stdin();
                                }
                            }
                            _ => {}
                        }
                    }
                    Frame::RstStream { stream_id, .. } if channels.get(&stream_id) == Some(&STDIN) => ends.close_stdin(),
                    Frame::Ping { id } => {
                        conn.w.send(Frame::Ping { id }).await;
                    }
                    Frame::GoAway { .. } => break,
                    _ => {}
                }
            }
            out = ends.out.recv(), if streams_ready => match out {
                Some(Outgoing::Data(ch, data)) => {
                    if let Some(&id) = ids.get(&ch)
                        && !conn.w.send_data(id, &data, false).await
                    {
                        break;
                    }
                }
                Some(Outgoing::Finish(status)) => {
                    for ch in [STDOUT, STDERR] {
                        if let Some(&id) = ids.get(&ch) {
                            conn.w.send_data(id, &[], true).await;
                        }
                    }
                    if let Some(&id) = ids.get(&ERROR) {
                        let body = if status["status"] == "Success" { Vec::new() } else { status.to_string().into_bytes() };
                        conn.w.send_data(id, &body, true).await;
                    }
                    conn.finish().await;
                    ends.gone.send_replace(true);
                    return;
                }
                None => break,
            },
            () = tokio::time::sleep_until(deadline), if !streams_ready => {
                debug!("the client did not open the session's streams in time");
                break;
            }
        }
    }
    ends.gone.send_replace(true);
}

/// Connects a port-forward's data stream to `port` of the pod.
pub(crate) type Dialer = Arc<dyn Fn(u16) -> Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>> + Send + Sync>;

/// Serves a port-forward session: every data stream becomes one TCP connection to the pod's
/// port named in its headers; a failure is reported on the error stream of the same request.
pub(crate) async fn serve_port_forward<S>(io: S, pod: String, dial: Dialer)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = Connection::start(io);
    let mut error_streams: HashMap<String, u32> = HashMap::new();
    let mut to_pod: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let frame = match conn.next().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                debug!(error = %e, "port-forward session ended");
                break;
            }
        };
        match frame {
            Frame::SynStream { stream_id, headers, .. } => {
                let request = spdy::header(&headers, "requestid").unwrap_or("").to_string();
                let port = spdy::header(&headers, "port").and_then(|p| p.parse::<u16>().ok()).filter(|p| *p > 0);
                let kind = spdy::header(&headers, "streamtype").unwrap_or("");
                let Some(port) = port else {
                    conn.w.send(Frame::RstStream { stream_id, status: CANCEL }).await;
                    continue;
                };
                conn.w.send(Frame::SynReply { stream_id, flags: 0, headers: vec![] }).await;
                match kind {
                    "error" => {
                        error_streams.insert(request, stream_id);
                    }
                    "data" => {
                        let (tx, rx) = mpsc::channel(16);
                        to_pod.insert(stream_id, tx);
                        let error_stream = error_streams.get(&request).copied();
                        let frames = conn.w.tx.clone();
                        let dial = dial.clone();
                        let pod = pod.clone();
                        tasks.spawn(forward(stream_id, error_stream, port, pod, dial, rx, frames));
                    }
                    _ => {
                        conn.w.send(Frame::RstStream { stream_id, status: CANCEL }).await;
                    }
                }
            }
            Frame::Data { stream_id, flags, data } => {
                if let Some(tx) = to_pod.get(&stream_id) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        to_pod.remove(&stream_id);
                    }
                    if flags & FLAG_FIN != 0 {
                        to_pod.remove(&stream_id);
                    }
                }
            }
            Frame::RstStream { stream_id, .. } => {
                to_pod.remove(&stream_id);
            }
            Frame::Ping { id } => {
                conn.w.send(Frame::Ping { id }).await;
            }
            Frame::GoAway { .. } => break,
            _ => {}
        }
        while tasks.try_join_next().is_some() {}
    }
    tasks.abort_all();
}

/// One forwarded connection: client data to the pod, the pod's answers back on the data stream.
async fn forward(
    stream_id: u32,
    error_stream: Option<u32>,
    port: u16,
    pod: String,
    dial: Dialer,
    mut from_client: mpsc::Receiver<Bytes>,
    frames: mpsc::Sender<Frame>,
) {
    let tcp = match dial(port).await {
        Ok(t) => t,
        Err(e) => {
            let msg = format!("error forwarding port {port} to pod {pod}: failed to connect to localhost:{port}: {e}");
            if let Some(id) = error_stream {
                let _ = frames.send(Frame::Data { stream_id: id, flags: FLAG_FIN, data: Bytes::from(msg) }).await;
            }
            let _ = frames.send(Frame::Data { stream_id, flags: FLAG_FIN, data: Bytes::new() }).await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr) = tcp.into_split();
    let upstream = async move {
        while let Some(data) = from_client.recv().await {
            if wr.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; MAX_DATA_CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let f = Frame::Data { stream_id, flags: 0, data: Bytes::copy_from_slice(&buf[..n]) };
                    if frames.send(f).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = frames.send(Frame::Data { stream_id, flags: FLAG_FIN, data: Bytes::new() }).await;
        // The client waits for the error stream to end (empty: no error) before it closes the
        // local connection.
        if let Some(id) = error_stream {
            let _ = frames.send(Frame::Data { stream_id: id, flags: FLAG_FIN, data: Bytes::new() }).await;
        }
    };
    tokio::join!(upstream, downstream);
}
