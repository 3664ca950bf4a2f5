//! # idem-nats
//!
//! NATS JetStream for idem's outbox: a [`JetStreamPublisher`] implements
//! [`idem_outbox::Publisher`] with [async-nats](https://docs.rs/async-nats),
//! so an [`idem_outbox::Relay`] publishes every committed outbox message to
//! a stream, and counts it published only once JetStream acknowledged it.
//!
//! - The subject is a prefix and the message's kind
//!   ([`JetStreamOptions::subject`]): `events` and `order.placed` make
//!   `events.order.placed`, which a stream on `events.>` stores.
//! - The header `Nats-Msg-Id` is the outbox message id, so JetStream drops a
//!   second publish of one message within the stream's duplicate window and
//!   answers that it was a duplicate: the relay then counts it in
//!   [`RelayPass::duplicates`](idem_outbox::RelayPass::duplicates). The
//!   message's headers travel as NATS headers, with [`AGGREGATE_HEADER`]
//!   and [`SEQUENCE_HEADER`].
//! - A batch is published whole, then every PubAck awaited; a message is
//!   `Ok` only on its PubAck ([`Published::duplicate`] when the PubAck says
//!   so); no stream for the subject, an error from the stream, or no PubAck
//!   within the time limit ([`JetStreamOptions::with_timeout`], 10 s by
//!   default) is an `Err`.
//!
//! The consuming side: a [`JetStreamSource`] is a durable pull consumer
//! with explicit acks as an `idem_consumer::Source`, so an
//! `idem_consumer::Consumer` applies each message once (its inbox), NAKs a
//! failure with a delay and parks it at the consumer's own count of failed
//! attempts (the durable consumer delivers without limit: only the
//! consumer decides that a message is done).
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_memory::MemoryOutbox;
//! use idem_nats::{JetStreamOptions, JetStreamPublisher};
//! use idem_outbox::{Relay, RelayOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = JetStreamPublisher::connect("nats://127.0.0.1:4222", JetStreamOptions::new("events")?).await?;
//! let relay = Relay::new(Arc::new(MemoryOutbox::new()), Arc::new(publisher), RelayOptions::default());
//! relay.run(std::future::pending()).await;
//! # Ok(())
//! # }
//! ```
//!
//! A consumer reads a stream through a durable consumer of its own name
//! (created with unlimited deliveries and its ack wait):
//!
//! ```no_run
//! use idem_nats::JetStreamSource;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let context = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! let config = JetStreamSource::durable("shipping", std::time::Duration::from_secs(30));
//! let mut source = JetStreamSource::attach(&context, "ORDERS", config).await?;
//! // then consumer.run(&mut source, shutdown): see idem-consumer's guide
//! # let _ = &mut source;
//! # Ok(())
//! # }
//! ```

mod consumer;

pub use consumer::{JetStreamDelivery, JetStreamSource};

use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::context::{Context, ContextBuilder, PublishAckFuture};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue, Subject};
use bytes::Bytes;
use idem_core::InvalidInput;
use idem_core::store::OutboxMessage;
use idem_outbox::{PublishError, Published, Publisher, async_trait};
use tokio::time::{Instant, timeout_at};

/// The broker's name in a [`PublishError`].
pub const BROKER: &str = "nats";

/// The NATS header holding the message's aggregate.
pub const AGGREGATE_HEADER: &str = "Idem-Aggregate";

/// The NATS header holding the message's sequence in its aggregate, in
/// decimal (1, 2, 3...).
pub const SEQUENCE_HEADER: &str = "Idem-Sequence";

/// A batch's time limit unless [`JetStreamOptions::with_timeout`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how a [`JetStreamPublisher`] publishes; each setter checks its
/// value, so a publisher never starts with a bad one.
///
/// ```
/// use std::time::Duration;
/// use idem_nats::JetStreamOptions;
///
/// let options = JetStreamOptions::new("events")?.with_timeout(Duration::from_secs(5))?;
/// assert_eq!(options.subject("order.placed")?.as_str(), "events.order.placed");
/// assert!(JetStreamOptions::new("events.>").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamOptions {
    subject_prefix: String,
    timeout: Duration,
}

impl JetStreamOptions {
    /// Publishes to subjects under `subject_prefix` (a NATS subject: dot
    /// separated tokens, none empty, no whitespace, no wildcard), with a
    /// 10 s limit.
    ///
    /// ```
    /// use idem_nats::JetStreamOptions;
    ///
    /// assert_eq!(JetStreamOptions::new("shop.events")?.subject_prefix(), "shop.events");
    /// assert!(JetStreamOptions::new("").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a prefix that is not such a subject.
    pub fn new(subject_prefix: &str) -> Result<Self, InvalidInput> {
        let subject = publish_subject("subject prefix", subject_prefix)?;
        Ok(Self {
            subject_prefix: subject.to_string(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same with a time limit on each batch, from its first publish to
    /// its last PubAck (more than zero, at most
    /// [`MAX_PUBLISH_TIMEOUT`](idem_outbox::MAX_PUBLISH_TIMEOUT)): what is
    /// not acknowledged by then is an `Err`. Keep it under the relay's
    /// lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_nats::JetStreamOptions;
    ///
    /// let options = JetStreamOptions::new("events")?.with_timeout(Duration::from_secs(3))?;
    /// assert_eq!(options.timeout(), Duration::from_secs(3));
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside that range.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, InvalidInput> {
        self.timeout = idem_outbox::validate_publish_timeout(timeout)?;
        Ok(self)
    }

    /// The subject prefix.
    ///
    /// ```
    /// # use idem_nats::JetStreamOptions;
    /// assert_eq!(JetStreamOptions::new("events")?.subject_prefix(), "events");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn subject_prefix(&self) -> &str {
        &self.subject_prefix
    }

    /// The time limit on a batch.
    ///
    /// ```
    /// # use idem_nats::{JetStreamOptions, DEFAULT_TIMEOUT};
    /// assert_eq!(JetStreamOptions::new("events")?.timeout(), DEFAULT_TIMEOUT);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The subject of a message of `kind`: the prefix, a dot, and the kind
    /// as it is (`events` and `order.placed` make `events.order.placed`).
    ///
    /// ```
    /// # use idem_nats::JetStreamOptions;
    /// let options = JetStreamOptions::new("events")?;
    /// assert_eq!(options.subject("order.placed")?.as_str(), "events.order.placed");
    /// assert!(options.subject("order placed").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when the kind does not make a subject (whitespace,
    /// an empty token, a wildcard).
    pub fn subject(&self, kind: &str) -> Result<Subject, InvalidInput> {
        publish_subject("subject", &format!("{}.{kind}", self.subject_prefix))
    }
}

/// `subject` checked as a subject one publishes to.
fn publish_subject(field: &'static str, subject: &str) -> Result<Subject, InvalidInput> {
    let subject = Subject::validated(subject).map_err(|e| InvalidInput::Malformed {
        field,
        reason: format!("{subject:?}: {e}"),
    })?;
    if subject.split('.').any(|token| token == "*" || token == ">") {
        return Err(InvalidInput::Malformed {
            field,
            reason: format!("{subject:?} holds a wildcard"),
        });
    }
    Ok(subject)
}

/// Why a [`JetStreamPublisher`] could not be made.
///
/// ```
/// use idem_nats::NatsError;
///
/// let error = NatsError::TimedOut;
/// assert_eq!(error.to_string(), "nats: no answer within the publish timeout");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The connection failed (a bad URL, a refused or failed login).
    #[error("nats: cannot connect: {0}")]
    Connect(#[source] async_nats::ConnectError),
    /// The server did not answer within the options' time limit.
    #[error("nats: no answer within the publish timeout")]
    TimedOut,
}

/// Publishes outbox messages to JetStream (see the [crate] documentation
/// for the subject and the headers). Cloning is cheap and shares the
/// connection; any number of relays may share one.
///
/// The stream must exist and store the subjects: the publisher creates
/// nothing. Its duplicate window (2 min by default) bounds how late a
/// second publish of one message is still dropped; keep it longer than the
/// relay's lease.
///
/// ```no_run
/// use idem_nats::{JetStreamOptions, JetStreamPublisher};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = JetStreamPublisher::new(async_nats::jetstream::new(client), JetStreamOptions::new("events")?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: Context,
    options: JetStreamOptions,
}

impl JetStreamPublisher {
    /// A publisher on a JetStream `context` (its own ack timeout, 5 s unless
    /// set, bounds each PubAck as well as the options' limit).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idem_nats::{JetStreamOptions, JetStreamPublisher};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let context = async_nats::jetstream::context::ContextBuilder::new()
    ///     .timeout(Duration::from_secs(10))
    ///     .build(client);
    /// let publisher = JetStreamPublisher::new(context, JetStreamOptions::new("events")?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(context: Context, options: JetStreamOptions) -> Self {
        Self { context, options }
    }

    /// A publisher on a connection of its own to `url`
    /// (`nats://host:4222`, or `tls://` for TLS), within the options' time
    /// limit, on a context whose ack timeout is that limit. async-nats
    /// reconnects by itself when the connection drops.
    ///
    /// ```no_run
    /// use idem_nats::{JetStreamOptions, JetStreamPublisher};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let publisher = JetStreamPublisher::connect("nats://127.0.0.1:4222", JetStreamOptions::new("events")?).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`NatsError::Connect`], [`NatsError::TimedOut`].
    pub async fn connect(url: &str, options: JetStreamOptions) -> Result<Self, NatsError> {
        let connecting = async_nats::ConnectOptions::new()
            .name("idem-outbox")
            .connect(url);
        let client = tokio::time::timeout(options.timeout, connecting)
            .await
            .map_err(|_| NatsError::TimedOut)?
            .map_err(NatsError::Connect)?;
        let context = ContextBuilder::new().timeout(options.timeout).build(client);
        Ok(Self::new(context, options))
    }

    /// The options.
    ///
    /// ```no_run
    /// # use idem_nats::JetStreamPublisher;
    /// # fn show(publisher: &JetStreamPublisher) {
    /// println!("publishing under {}", publisher.options().subject_prefix());
    /// # }
    /// ```
    pub fn options(&self) -> &JetStreamOptions {
        &self.options
    }

    /// The JetStream context it publishes through.
    ///
    /// ```no_run
    /// # use idem_nats::JetStreamPublisher;
    /// # async fn run(publisher: &JetStreamPublisher) -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = publisher.context().get_stream("EVENTS").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The subject and the message to publish for `message`.
    fn envelope(&self, message: &OutboxMessage) -> Result<(Subject, PublishMessage), String> {
        let new = message.message();
        let subject = self
            .options
            .subject(new.kind())
            .map_err(|e| e.to_string())?;
        let mut headers = HeaderMap::new();
        for (name, value) in new.headers() {
            headers.append(header_name(name)?, header_value(value)?);
        }
        headers.insert(
            header_name(AGGREGATE_HEADER)?,
            header_value(new.aggregate())?,
        );
        headers.insert(
            header_name(SEQUENCE_HEADER)?,
            HeaderValue::from(message.parts().sequence),
        );
        // Last, so that no header of the message's own replaces it.
        let publish = PublishMessage::build()
            .payload(Bytes::copy_from_slice(new.payload()))
            .headers(headers)
            .message_id(message.id().to_string());
        Ok((subject, publish))
    }
}

#[async_trait]
impl Publisher for JetStreamPublisher {
    /// Publishes the whole batch, then awaits every PubAck, all within the
    /// time limit: `Ok` on a PubAck ([`Published::duplicate`] when
    /// JetStream dropped it as one), `Err` otherwise.
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let deadline = Instant::now() + self.options.timeout;
        let failed = |error: String| PublishError::new(BROKER, error);
        let mut pending: Vec<Result<PublishAckFuture, String>> = Vec::with_capacity(batch.len());
        for message in batch {
            let sent = match self.envelope(message) {
                Err(error) => Err(error),
                Ok((subject, publish)) => {
                    match timeout_at(deadline, self.context.send_publish(subject, publish)).await {
                        Ok(Ok(ack)) => Ok(ack),
                        Ok(Err(error)) => Err(format!("publish failed: {error}")),
                        Err(_) => Err("not sent within the publish timeout".to_string()),
                    }
                }
            };
            pending.push(sent);
        }
        let mut results = Vec::with_capacity(batch.len());
        for sent in pending {
            let result = match sent {
                Err(error) => Err(failed(error)),
                Ok(ack) => match timeout_at(deadline, ack.into_future()).await {
                    Ok(Ok(ack)) if ack.duplicate => Ok(Published::duplicate()),
                    Ok(Ok(_)) => Ok(Published::stored()),
                    Ok(Err(error)) => Err(failed(format!("no PubAck: {error}"))),
                    Err(_) => Err(failed(
                        "not acknowledged within the publish timeout".to_string(),
                    )),
                },
            };
            results.push(result);
        }
        results
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_str(name).map_err(|_| {
        format!("header name {name:?} is not a NATS header name (printable ASCII, no ':')")
    })
}

fn header_value(value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("header value {value:?} holds a line break"))
}
