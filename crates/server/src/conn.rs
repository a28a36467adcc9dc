//! Accepting connections and closing the ones that stall: HTTP/1.1 over hyper, one task per
//! connection, each watched by its own timer.
//!
//! - **Header timeout**: a new connection must deliver a complete request head within it; so
//!   must a kept-alive one, counted from the first byte of its next request. A client that
//!   sends half a head and stalls (slow loris) is disconnected when it runs out.
//! - **Keep-alive timeout**: a connection idle between requests (its last response done, no
//!   byte of a next request yet) is closed after it.
//! - The body timeout is the handlers' ([`crate::http::body`]): they answer 408.
//!
//! A request in progress (its body, the engine's work, a long stream) is never cut by these
//! timers. On shutdown the listener stops, idle connections close, and requests in progress
//! run to their end.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

/// How long a connection may take over what (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTimeouts {
    pub header: Duration,
    pub keep_alive: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the requests in
/// progress finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: ConnTimeouts,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve_connection(stream, router.clone(), timeouts, stop_rx.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    timeouts: ConnTimeouts,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(WatchedIo {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let open = OpenRequest::begin(&activity);
            let router = router.clone();
            async move {
                let Ok(resp) = router.oneshot(req.map(Body::new)).await;
                Ok::<_, Infallible>(resp.map(|body| Body::new(TrackedBody { body, _open: open })))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The timers here replace hyper's own header timeout, which would also start while a
    // kept-alive connection idles.
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            // Dropping the connection closes the socket.
            () = activity.stalled(timeouts) => return,
            changed = stop.changed(), if !stopping => {
                let _ = changed;
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What a connection is doing, for its timers.
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
}

struct ActivityState {
    /// Requests whose responses are not done yet.
    open: usize,
    /// Since when no request has been open.
    idle_since: Instant,
    /// When the first byte of the next request head arrived, if one has.
    head_started: Option<Instant>,
    /// Whether a request has been served: a new connection waits for its first head under
    /// the header timeout, a kept-alive one under the keep-alive timeout.
    served: bool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: Mutex::new(ActivityState {
                open: 0,
                idle_since: Instant::now(),
                head_started: None,
                served: false,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived from the client.
    fn bytes_read(&self) {
        let mut s = self.lock();
        if s.open == 0 && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
            drop(s);
            self.changed.notify_waiters();
        }
    }

    /// When the connection is to be closed as things stand (`None`: a request is open).
    fn deadline(&self, t: ConnTimeouts) -> Option<Instant> {
        let s = self.lock();
        if s.open > 0 {
            None
        } else if let Some(started) = s.head_started {
            Some(started + t.header)
        } else if s.served {
            Some(s.idle_since + t.keep_alive)
        } else {
            Some(s.idle_since + t.header)
        }
    }

    /// Completes when the connection has stalled past its timeout.
    async fn stalled(&self, t: ConnTimeouts) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so no change is missed.
            changed.as_mut().enable();
            match self.deadline(t) {
                None => changed.await,
                Some(deadline) if deadline <= Instant::now() => return,
                Some(deadline) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }
}

/// One request from its head until its response is done (or dropped).
struct OpenRequest {
    activity: Arc<Activity>,
}

impl OpenRequest {
    fn begin(activity: &Arc<Activity>) -> Self {
        {
            let mut s = activity.lock();
            s.open += 1;
            s.head_started = None;
            s.served = true;
        }
        activity.changed.notify_waiters();
        OpenRequest {
            activity: activity.clone(),
        }
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        {
            let mut s = self.activity.lock();
            s.open -= 1;
            if s.open == 0 {
                s.idle_since = Instant::now();
                s.head_started = None;
            }
        }
        self.activity.changed.notify_waiters();
    }
}

/// A response body that keeps its request open until it is done.
struct TrackedBody {
    body: Body,
    _open: OpenRequest,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling the connection's [`Activity`] when bytes arrive.
struct WatchedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        r
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
