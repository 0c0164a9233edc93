//! The remote command channels over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`): each
//! binary message is one channel byte and its data; v5 adds a close message (channel 255) that
//! half-closes one channel, which is how a client ends stdin.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::streams::{ERROR, Outgoing, STDIN, TransportEnds};

pub(crate) const V5: &str = "v5.channel.k8s.io";
pub(crate) const V4: &str = "v4.channel.k8s.io";
/// Port-forward's SPDY session carried in binary WebSocket messages (kubectl 1.31+).
pub(crate) const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

const CLOSE_CHANNEL: u8 = 255;

/// Carries `ends` over `ws` until the session finishes or the client goes away.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(ws: WebSocketStream<S>, v5: bool, mut ends: TransportEnds) {
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    let Some((&ch, rest)) = data.split_first() else { continue };
                    if v5 && ch == CLOSE_CHANNEL {
                        if rest.first() == Some(&STDIN) {
                            ends.close_stdin();
                        }
                        continue;
                    }
                    ends.incoming(ch, data.slice(1..)).await;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            out = ends.out.recv() => match out {
                Some(Outgoing::Data(ch, data)) => {
                    if sink.send(Message::Binary(framed(ch, &data))).await.is_err() {
                        break;
                    }
                }
                Some(Outgoing::Finish(status)) => {
                    let _ = sink.send(Message::Binary(framed(ERROR, status.to_string().as_bytes()))).await;
                    // A normal closure code: clients treat a close without one as an error.
                    let _ = sink.send(Message::Close(Some(normal_close()))).await;
                    // Let the client read the status and answer the close before the socket goes.
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                        while let Some(Ok(_)) = stream.next().await {}
                    }).await;
                    break;
                }
                None => {
                    let _ = sink.send(Message::Close(Some(normal_close()))).await;
                    break;
                }
            },
        }
    }
    ends.gone.send_replace(true);
}

fn normal_close() -> CloseFrame {
    CloseFrame { code: CloseCode::Normal, reason: "".into() }
}

fn framed(ch: u8, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 1);
    b.put_u8(ch);
    b.put_slice(data);
    b.freeze()
}

/// Carries a byte stream in binary messages (port-forward's SPDY session over WebSocket): what
/// arrives goes to `inner`, what `inner` produces goes out.
pub(crate) async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(ws: WebSocketStream<S>, inner: tokio::io::DuplexStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(inner);
    let inbound = async {
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Binary(data) if wr.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(Some(normal_close()))).await;
    };
    tokio::select! {
        () = inbound => {}
        () = outbound => {}
    }
}

/// Port-forward over WebSocket channels (as kube-rs speaks it): for the i-th port of the
/// request, channel 2i carries the data of one connection to it and 2i+1 its error; each channel
/// opens with the port number (two bytes, little-endian).
pub(crate) async fn serve_port_forward<S: AsyncRead + AsyncWrite + Unpin>(
    ws: WebSocketStream<S>,
    pod: String,
    ports: Vec<u16>,
    dial: crate::spdy_session::Dialer,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut sink, mut stream) = ws.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<(u8, Bytes)>(16);
    let mut writers = Vec::new();
    let mut readers = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let (data, error) = ((2 * i) as u8, (2 * i + 1) as u8);
        for ch in [data, error] {
            if sink.send(Message::Binary(framed(ch, &port.to_le_bytes()))).await.is_err() {
                return;
            }
        }
        match dial(port).await {
            Ok(tcp) => {
                let (mut rd, wr) = tcp.into_split();
                writers.push(Some(wr));
                let tx = out_tx.clone();
                readers.spawn(async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    while let Ok(n) = rd.read(&mut buf).await {
                        if n == 0 || tx.send((data, Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => {
                writers.push(None);
                let msg = format!("error forwarding port {port} to pod {pod}: failed to connect to localhost:{port}: {e}");
                let _ = sink.send(Message::Binary(framed(error, msg.as_bytes()))).await;
            }
        }
    }
    drop(out_tx);
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    let Some((&ch, rest)) = data.split_first() else { continue };
                    let i = usize::from(ch / 2);
                    if ch % 2 == 0
                        && let Some(Some(w)) = writers.get_mut(i)
                        && w.write_all(rest).await.is_err()
                    {
                        writers[i] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            out = out_rx.recv() => match out {
                Some((ch, data)) => {
                    if sink.send(Message::Binary(framed(ch, &data))).await.is_err() {
                        break;
                    }
                }
                // Every connection to the pod has ended.
                None => {
                    let _ = sink.send(Message::Close(Some(normal_close()))).await;
                    break;
                }
            },
        }
    }
    readers.abort_all();
}
