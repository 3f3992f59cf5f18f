//! The response future: a request waiting for a limit, and the refunds
//! and fields settled on the response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::fields::Fields;
use super::limits::Limits;
use super::reject::Respond;
use super::shared::Shared;
use super::ResponseHead;
use crate::key::RequestHead;

pin_project! {
    /// The response future of a [`PaceService`](super::PaceService).
    pub struct ResponseFuture<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>>,
        L: Limits,
    {
        #[pin]
        kind: Kind<S, ReqBody, L, H>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>>,
        L: Limits,
    {
        // Answered by the layer.
        Rejected { response: Option<S::Response> },
        // A shared limit is in flight (boxed: the admitted paths keep the
        // future small).
        Reserving { wait: Box<Reserving<S, ReqBody, L, H>> },
        // Admitted, nothing to do after the response.
        Passthrough { #[pin] future: S::Future },
        // Admitted, no refunds: the fields, written when it was admitted.
        Fields { #[pin] future: S::Future, fields: Option<Fields> },
        // Admitted: refunds and fields once the response is known.
        Settle { #[pin] future: S::Future, settle: Option<Settle<L, H>> },
    }
}

/// A request waiting for a limit that answers later. Dropped while it
/// waits, it keeps what the limits before it admitted.
struct Reserving<S, ReqBody, L: Limits, H> {
    st: Option<L::State>,
    req: Option<Request<ReqBody>>,
    svc: Option<S>,
    shared: Arc<Shared<L, H>>,
}

impl<S, ReqBody, L: Limits, H> Drop for Reserving<S, ReqBody, L, H> {
    fn drop(&mut self) {
        if let Some(st) = &mut self.st {
            self.shared.limits.keep(st);
        }
    }
}

impl<S, ReqBody, L, H> fmt::Debug for ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>>,
    L: Limits,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqBody, L, H> ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>>,
    L: Limits,
{
    /// Answered by the layer with `response`.
    #[inline]
    pub(super) fn rejected(response: S::Response) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                response: Some(response),
            },
        }
    }

    /// Admitted, with nothing to do after the response.
    #[inline]
    pub(super) fn passthrough(future: S::Future) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    /// Admitted without refunds: `fields` are written on the response.
    #[inline]
    pub(super) fn fields(future: S::Future, fields: Fields) -> Self {
        ResponseFuture {
            kind: Kind::Fields {
                future,
                fields: Some(fields),
            },
        }
    }

    /// Waits for a limit that answers later (`st`), then calls `svc`
    /// (ready) with `req`.
    #[inline]
    pub(super) fn reserving(
        st: L::State,
        req: Request<ReqBody>,
        svc: S,
        shared: Arc<Shared<L, H>>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Reserving {
                wait: Box::new(Reserving {
                    st: Some(st),
                    req: Some(req),
                    svc: Some(svc),
                    shared,
                }),
            },
        }
    }

    /// Counts the admission and calls `svc` (ready).
    #[inline(always)]
    pub(super) fn admitted(
        svc: &mut S,
        req: Request<ReqBody>,
        mut st: L::State,
        shared: &Arc<Shared<L, H>>,
    ) -> Self {
        shared.limits.admitted(&st);
        if shared.refunds {
            // Admitted: only the refund predicates can return something
            // now; the other limits' holds are kept before the inner call.
            shared.limits.keep_unrefunded(&mut st);
            let future = svc.call(req);
            return ResponseFuture {
                kind: Kind::Settle {
                    future,
                    settle: Some(Settle {
                        st,
                        shared: shared.clone(),
                    }),
                },
            };
        }
        if shared.headers {
            // Written now, while the rows are in cache: nothing of the layer
            // waits for the response.
            let fields = Fields::of(shared, &st);
            shared.limits.keep(&mut st);
            let future = svc.call(req);
            return ResponseFuture {
                kind: Kind::Fields {
                    future,
                    fields: Some(fields),
                },
            };
        }
        shared.limits.keep(&mut st);
        ResponseFuture {
            kind: Kind::Passthrough {
                future: svc.call(req),
            },
        }
    }
}

impl<S, ReqBody, ResBody, L, H> Future for ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    L: Limits,
    H: Respond<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().kind.project() {
                KindProj::Passthrough { future } => return future.poll(cx),
                KindProj::Fields { future, fields } => {
                    let out = std::task::ready!(future.poll(cx));
                    return Poll::Ready(out.map(|mut resp| {
                        if let Some(f) = fields.take() {
                            f.write(resp.headers_mut());
                        }
                        resp
                    }));
                }
                KindProj::Rejected { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("ResponseFuture polled after completion")))
                }
                KindProj::Settle { future, settle } => {
                    let mut out = std::task::ready!(future.poll(cx));
                    // Settled in place (not moved out of the future), then
                    // dropped, which keeps what was not refunded; without a
                    // response (the inner service failed), that is all.
                    if let (Ok(resp), Some(s)) = (&mut out, settle.as_mut()) {
                        s.settle(resp);
                    }
                    *settle = None;
                    return Poll::Ready(out);
                }
                KindProj::Reserving { wait } => {
                    let Reserving {
                        st,
                        req,
                        svc,
                        shared,
                    } = &mut **wait;
                    let state = st.as_mut().expect("ResponseFuture polled after completion");
                    let done = std::task::ready!(shared.limits.poll_reserve(state, cx));
                    let req = req.take().expect("ResponseFuture polled after completion");
                    match done {
                        Ok(()) => {
                            let mut svc = svc.take().expect("a ready service");
                            let state = st.take().expect("the state");
                            ResponseFuture::admitted(&mut svc, req, state, shared)
                        }
                        Err(stop) => {
                            ResponseFuture::rejected(shared.reject(stop, &RequestHead::of(&req)))
                        }
                    }
                }
            };
            self.set(next);
        }
    }
}

/// What an admitted request does once its response is known: refunds and
/// the `RateLimit` fields. Whatever it holds that is not refunded is kept
/// when it is dropped: after the fields are written, or without a
/// response (the inner service failed, or the response future was
/// dropped).
struct Settle<L: Limits, H> {
    st: L::State,
    shared: Arc<Shared<L, H>>,
}

impl<L: Limits, H> Drop for Settle<L, H> {
    fn drop(&mut self) {
        self.shared.limits.keep(&mut self.st);
    }
}

impl<L: Limits, H> Settle<L, H> {
    /// Applies the refund predicates to `resp`, then writes its fields
    /// (in place: the response is not taken apart and put back). What is
    /// not refunded is kept when the settle is dropped, after this.
    fn settle<B>(&mut self, resp: &mut Response<B>) {
        let shared = &*self.shared;
        {
            let head = ResponseHead {
                status: resp.status(),
                headers: resp.headers(),
                extensions: resp.extensions(),
            };
            shared.limits.settle(&mut self.st, &head, &shared.metas);
        }
        if shared.headers {
            Fields::of(shared, &self.st).write(resp.headers_mut());
        }
    }
}
