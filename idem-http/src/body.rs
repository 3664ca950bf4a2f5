//! The body of the layer's responses.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

pin_project_lite::pin_project! {
    /// The body of [`IdempotencyService`](crate::IdempotencyService)'s
    /// responses: the inner service's own, untouched, for a request the
    /// layer passes through; a buffered one for a request it handled (the
    /// handler's response read whole, a replay or a problem).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Passed { #[pin] body: B },
        Buffered { #[pin] body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn passed(body: B) -> Self {
        Self {
            kind: Kind::Passed { body },
        }
    }

    pub(crate) fn buffered(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Buffered { body },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Passed { body } => body.poll_frame(cx),
            // A buffered body never fails.
            KindProj::Buffered { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passed { body } => body.is_end_stream(),
            Kind::Buffered { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passed { body } => body.size_hint(),
            Kind::Buffered { body } => body.size_hint(),
        }
    }
}
