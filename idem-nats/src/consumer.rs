//! The consuming side: a JetStream durable pull consumer as an
//! `idem_consumer::Source`, each message an `idem_consumer::Delivery`.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind, Context};
use futures_util::StreamExt;
use idem_consumer::{BrokerError, Delivery, RawMessage, RedeliveryHorizon, Source, async_trait};
use idem_core::store::{InboundMessage, Timestamp};

use crate::{AGGREGATE_HEADER, BROKER, SEQUENCE_HEADER};

/// The header JetStream deduplicates on, and the consumer's message id.
const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// How long one exchange with the server (the consumer's setup, an ack, a
/// NAK, a keep-alive) may take. An ack is only queued on the client's
/// connection, but that queue stops taking commands while a stalled
/// network holds what was written: a call is then given up on, with a
/// retryable error, rather than waited for forever.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One async-nats call given up on after [`TIMEOUT`], its error named
/// `operation`.
async fn call<T, E: std::fmt::Display>(
    operation: &'static str,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, BrokerError> {
    idem_consumer::bounded(BROKER, operation, TIMEOUT, async {
        work.await.map_err(|e| broker(operation)(e.to_string()))
    })
    .await
}

/// A JetStream durable pull consumer with explicit acks, as a source of
/// deliveries for an `idem_consumer::Consumer`.
///
/// - The message id is the `Nats-Msg-Id` header (the outbox message id
///   when `idem-outbox` published it), or `<stream>:<stream sequence>`
///   for a message published without one; the aggregate and its version
///   are [`AGGREGATE_HEADER`] and [`SEQUENCE_HEADER`]; the type is the
///   subject.
/// - An ack is JetStream's `+ACK`, a retry a NAK with the delay, and a
///   delivery the consumer still holds is said to be in progress
///   (`+WPI`), so JetStream sends no copy of it past the ack wait; the
///   delivery count is JetStream's own (it counts copies no consumer
///   settled, so the consumer parks by its own count, never by this one).
/// - The horizon is the consumer's `ack_wait`, `max_deliver` and
///   `backoff`, and the stream's `duplicate_window`, read from the server.
///   The durable consumer must deliver without limit (`max_deliver` -1,
///   as [`durable`](Self::durable) sets it): JetStream drops a message at
///   its `max_deliver` counting deliveries no consumer settled (held past
///   the ack wait, dropped with an aborted task), and
///   `idem_consumer::Consumer::check` refuses a durable consumer with one.
/// - A message that cannot be an inbound message (an id or subject over
///   255 bytes, a version that is not a positive number) is handed to the
///   consumer as what could be kept of it, with the reason
///   (`idem_consumer::Delivery::malformed`): the consumer parks it at
///   once, and JetStream never drops it.
/// - Each call to the server (the setup, an ack, a NAK, a keep-alive)
///   gives up after 10 s with a retryable [`BrokerError`].
///
/// ```no_run
/// use std::time::Duration;
/// use async_nats::jetstream::consumer::pull;
/// use idem_nats::JetStreamSource;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let context = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
/// let config = JetStreamSource::durable("billing", Duration::from_secs(30));
/// let source = JetStreamSource::attach(&context, "ORDERS", config).await?;
/// println!("{:?}", idem_consumer::Source::horizon(&source));
/// # Ok(()) }
/// ```
pub struct JetStreamSource {
    stream: String,
    messages: pull::Stream,
    horizon: RedeliveryHorizon,
}

impl std::fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("stream", &self.stream)
            .field("horizon", &self.horizon)
            .finish_non_exhaustive()
    }
}

fn broker(operation: &'static str) -> impl Fn(String) -> BrokerError {
    move |message| BrokerError::unavailable(BROKER, operation, message)
}

impl JetStreamSource {
    /// The configuration of a durable pull consumer named `name` with
    /// explicit acks, `ack_wait`, and no limit on deliveries (`max_deliver`
    /// -1: only the consumer decides that a message is done); set more
    /// fields (`filter_subject`, `backoff`, `max_ack_pending`) on it as
    /// needed, never `max_deliver`.
    ///
    /// ```
    /// let config = idem_nats::JetStreamSource::durable("billing", std::time::Duration::from_secs(30));
    /// assert_eq!(config.max_deliver, -1);
    /// ```
    pub fn durable(name: &str, ack_wait: Duration) -> pull::Config {
        pull::Config {
            durable_name: Some(name.to_string()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            max_deliver: -1,
            ..Default::default()
        }
    }

    /// Creates the durable consumer of `config` on `stream` if it is
    /// missing (or finds it), and starts pulling from it.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the stream or the consumer cannot be had; a
    /// retryable one when the server gave no answer within 10 s.
    pub async fn attach(
        context: &Context,
        stream: &str,
        config: pull::Config,
    ) -> Result<Self, BrokerError> {
        idem_consumer::bounded(
            BROKER,
            "setup",
            TIMEOUT,
            Self::set_up(context, stream, config),
        )
        .await
    }

    /// [`attach`](Self::attach) without its time limit.
    async fn set_up(
        context: &Context,
        stream: &str,
        config: pull::Config,
    ) -> Result<Self, BrokerError> {
        let setup = broker("setup");
        let mut found = context
            .get_stream(stream)
            .await
            .map_err(|e| setup(format!("stream {stream}: {e}")))?;
        let window = found
            .info()
            .await
            .map_err(|e| setup(format!("stream {stream}: {e}")))?
            .config
            .duplicate_window;
        let name = config.durable_name.clone().unwrap_or_default();
        let consumer: PullConsumer = found
            .get_or_create_consumer(&name, config)
            .await
            .map_err(|e| setup(format!("consumer {name}: {e}")))?;
        let info = consumer.cached_info();
        let mut horizon = RedeliveryHorizon::new(BROKER, info.config.ack_wait)
            .with_backoff(info.config.backoff.clone());
        // JetStream answers -1 (or 0) for no limit.
        if let Ok(max) = u32::try_from(info.config.max_deliver)
            && max > 0
        {
            horizon = horizon.with_max_deliveries(max);
        }
        if !window.is_zero() {
            horizon = horizon.with_duplicate_window(window);
        }
        let messages = consumer
            .messages()
            .await
            .map_err(|e| setup(format!("consumer {name}: {e}")))?;
        Ok(Self {
            stream: stream.to_string(),
            messages,
            horizon,
        })
    }
}

/// One JetStream delivery.
pub struct JetStreamDelivery {
    message: jetstream::Message,
    inbound: InboundMessage,
    /// Why it cannot be applied, if it could not be read.
    malformed: Option<String>,
    deliveries: u32,
    published_at: Option<Timestamp>,
}

impl std::fmt::Debug for JetStreamDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamDelivery")
            .field("message", &self.inbound)
            .field("deliveries", &self.deliveries)
            .finish_non_exhaustive()
    }
}

impl JetStreamDelivery {
    fn new(message: jetstream::Message) -> Self {
        let (inbound, malformed) = inbound(&message);
        let info = message.info().ok().map(|info| {
            let millis = info.published.unix_timestamp_nanos() / 1_000_000;
            let published = i64::try_from(millis).ok().map(Timestamp::from_unix_millis);
            (u32::try_from(info.delivered).unwrap_or(1), published)
        });
        let (deliveries, published_at) = info.unwrap_or((1, None));
        Self {
            message,
            inbound,
            malformed,
            deliveries,
            published_at,
        }
    }
}

fn header<'a>(message: &'a jetstream::Message, name: &str) -> Option<&'a str> {
    let headers = message.headers.as_ref()?;
    headers.get(name).map(|value| value.as_str())
}

/// The message as the consumer reads it: whole, or why it cannot be and
/// what of it can be kept.
fn inbound(message: &jetstream::Message) -> (InboundMessage, Option<String>) {
    let id = match header(message, MSG_ID_HEADER) {
        Some(id) => Some(id.to_string()),
        None => message
            .info()
            .ok()
            .map(|info| format!("{}:{}", info.stream, info.stream_sequence)),
    };
    let mut raw = RawMessage::new(
        id.as_deref(),
        message.subject.as_str(),
        message.payload.to_vec(),
    );
    if let Some(aggregate) = header(message, AGGREGATE_HEADER) {
        raw = raw.with_aggregate(aggregate, header(message, SEQUENCE_HEADER));
    }
    if let Some(headers) = &message.headers {
        for (name, values) in headers.iter() {
            let name: &str = name.as_ref();
            if [MSG_ID_HEADER, AGGREGATE_HEADER, SEQUENCE_HEADER].contains(&name) {
                continue;
            }
            for value in values {
                raw = raw.with_header(name, value.as_str());
            }
        }
    }
    raw.read_or_salvage()
}

#[async_trait]
impl Delivery for JetStreamDelivery {
    fn message(&self) -> &InboundMessage {
        &self.inbound
    }

    fn deliveries(&self) -> u32 {
        self.deliveries
    }

    fn malformed(&self) -> Option<&str> {
        self.malformed.as_deref()
    }

    fn published_at(&self) -> Option<Timestamp> {
        self.published_at
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        call("ack", self.message.ack()).await
    }

    /// Every ack sent at once, pipelined on the connection, then the
    /// connection flushed, all within one time limit.
    async fn ack_all(batch: &[&Self]) -> Result<(), BrokerError> {
        let Some(first) = batch.first() else {
            return Ok(());
        };
        let acks = batch.iter().map(|delivery| delivery.message.ack());
        call("ack", async {
            let acked = futures_util::future::join_all(acks).await;
            for ack in acked {
                ack.map_err(|e| e.to_string())?;
            }
            // An ack is only queued on the client: flushed, it reaches the
            // server before whatever follows, the connection's end included
            // (a process ending right after its batch's acks would otherwise
            // have them all delivered again).
            first
                .message
                .context
                .client()
                .flush()
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        call("retry", self.message.ack_with(AckKind::Nak(Some(delay)))).await
    }

    /// `+WPI`: JetStream starts the delivery's ack wait again.
    async fn in_progress(&self) -> Result<(), BrokerError> {
        call("in progress", self.message.ack_with(AckKind::Progress)).await
    }
}

#[async_trait]
impl Source for JetStreamSource {
    type Delivery = JetStreamDelivery;

    async fn next(&mut self) -> Result<Option<JetStreamDelivery>, BrokerError> {
        let Some(next) = self.messages.next().await else {
            return Ok(None);
        };
        let message = next.map_err(|e| broker("receive")(e.to_string()))?;
        Ok(Some(JetStreamDelivery::new(message)))
    }

    fn horizon(&self) -> RedeliveryHorizon {
        self.horizon.clone()
    }
}
