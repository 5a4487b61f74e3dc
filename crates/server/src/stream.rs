//! Streamed replies: one driver for every API. It merges the choices' [`Reply`] streams, hands each
//! [`Piece`] to the API's [`Render`], and writes the frames it produces (SSE or NDJSON) to the body.
//!
//! The body is a bounded channel: when a client stops reading, the channel fills and a write that
//! cannot complete within the write timeout ends the stream, which drops the replies and so cancels
//! their sequences (a stalled client never holds a sequence forever).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::pipeline::{Piece, Reply};

/// Frames waiting to be written.
#[derive(Default)]
pub struct Frames(Vec<Bytes>);

impl Frames {
    /// An SSE frame `data: {json}`, with an `event:` line when given.
    pub fn sse(&mut self, event: Option<&str>, data: &Value) {
        let mut s = String::new();
        if let Some(e) = event {
            s.push_str("event: ");
            s.push_str(e);
            s.push('\n');
        }
        s.push_str("data: ");
        s.push_str(&data.to_string());
        s.push_str("\n\n");
        self.0.push(Bytes::from(s));
    }

    /// One NDJSON line.
    pub fn ndjson(&mut self, data: &Value) {
        let mut s = data.to_string();
        s.push('\n');
        self.0.push(Bytes::from(s));
    }

    /// Bytes as they are (`data: [DONE]\n\n`).
    pub fn raw(&mut self, s: &'static str) {
        self.0.push(Bytes::from_static(s.as_bytes()));
    }
}

/// An API's streamed shape of a reply.
pub trait Render: Send + 'static {
    /// Frames before anything else.
    fn open(&mut self, _out: &mut Frames) {}
    /// One piece of choice `choice`.
    fn piece(&mut self, choice: usize, piece: &Piece, out: &mut Frames);
    /// After the last choice ended.
    fn close(&mut self, _out: &mut Frames) {}
    /// A choice failed: the stream ends after these frames.
    fn fail(&mut self, err: &ApiError, out: &mut Frames);
    /// How long the stream may stay silent before [`Render::keepalive`] (`None`: no keep-alive).
    fn keepalive_every(&self) -> Option<Duration> {
        None
    }
    /// Frames that keep a silent stream alive (a long prefill), for APIs that have them.
    fn keepalive(&mut self, _out: &mut Frames) {}
}

/// How streamed bodies are written.
#[derive(Clone, Copy, Debug)]
pub struct StreamConfig {
    /// Longest a write may wait for the client to read before the stream is cancelled.
    pub write_timeout: Duration,
}

impl Default for StreamConfig {
    fn default() -> StreamConfig {
        StreamConfig {
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// Frames in flight before a write has to wait for the client.
const BUFFERED_FRAMES: usize = 64;

/// Streams `replies` through `render` as a `content_type` body.
pub fn respond<R: Render>(
    content_type: &'static str,
    mut render: R,
    replies: Vec<Reply>,
    cfg: StreamConfig,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(BUFFERED_FRAMES);
    tokio::spawn(async move {
        let n = replies.len();
        let mut merged =
            futures::stream::select_all(replies.into_iter().enumerate().map(|(i, reply)| {
                Box::pin(futures::stream::unfold(reply, move |mut r| async move {
                    r.next().await.map(|p| ((i, p), r))
                }))
            }));
        let mut out = Frames::default();
        render.open(&mut out);
        let mut done = 0;
        let mut failed = false;
        while done < n {
            if !flush(&tx, &mut out, cfg).await {
                return; // the client is gone or stalled: dropping `merged` cancels the rest
            }
            let next = match render.keepalive_every() {
                None => merged.next().await,
                Some(every) => match tokio::time::timeout(every, merged.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        render.keepalive(&mut out);
                        continue;
                    }
                },
            };
            let Some((i, piece)) = next else {
                break;
            };
            match &piece {
                Piece::Error(e) => {
                    tracing::warn!("a streamed reply failed: {e}");
                    render.fail(&ApiError::internal(e.clone()), &mut out);
                    failed = true;
                    break;
                }
                Piece::Done(_) => done += 1,
                Piece::Token { .. } => {}
            }
            render.piece(i, &piece, &mut out);
        }
        if !failed {
            render.close(&mut out);
        }
        flush(&tx, &mut out, cfg).await;
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Writes the pending frames; false when the client is gone or did not read within the timeout.
async fn flush(
    tx: &mpsc::Sender<Result<Bytes, std::convert::Infallible>>,
    out: &mut Frames,
    cfg: StreamConfig,
) -> bool {
    for frame in out.0.drain(..) {
        match tokio::time::timeout(cfg.write_timeout, tx.send(Ok(frame))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return false,
            Err(_) => {
                tracing::warn!(
                    "a client stopped reading its stream for {:?}; cancelling it",
                    cfg.write_timeout
                );
                return false;
            }
        }
    }
    true
}
