//! The consumer's rules, by part: this module holds the consumer, its
//! handler and its outcomes, and the check of retention against the
//! broker's horizon; [`run`] receives deliveries and gathers them into
//! batches, [`batch`] takes a batch through one transaction, [`settle`]
//! takes one delivery through its attempt and settles it (ack, retry or
//! park), and [`release`] replays what waits behind an applied event and
//! finds the aggregates stuck behind a gap.

mod batch;
mod release;
mod run;
mod settle;

pub use release::Stuck;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, InboundMessage, NewParked, ParkedMessage,
    ParkedQuery, ParkingStore, Resolution, Transaction, VersionCheck,
};
use idem_core::{
    ConsumerName, Fingerprint, HandlerError, Idempotency, IdempotencyKey, InvalidInput, RunError,
    RunOutcome, Scope, Storable, StoreError, StoredResponse, Verdict, async_trait,
};
use tracing::{Instrument, field};

use crate::delivery::{BrokerError, Delivery, RedeliveryHorizon, Source};

use crate::options::ConsumerOptions;

/// How many received deliveries may wait behind their aggregates per slot
/// of [`ConsumerOptions::concurrency`] before [`Consumer::run`] stops
/// receiving.
pub const WAITING_PER_SLOT: usize = 8;

/// What a handler found a message to be, after its writes: the handler's
/// verdict, which it returns. What the consumer then made of the delivery
/// (committed and acknowledged, retried, parked...) is a [`Settled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Handled {
    /// Its effect is written in the transaction: commit it.
    Applied,
    /// A duplicate or a stale event (its aggregate is at or past its
    /// version): nothing to write; it is acknowledged.
    Stale {
        /// The stored version.
        current: u64,
    },
    /// An event before it is missing: its writes are rolled back and it is
    /// delivered again later, then parked; later versions of its aggregate
    /// wait behind it, and the filled gap releases them.
    Gap {
        /// The stored version.
        current: u64,
    },
}

impl From<VersionCheck> for Handled {
    /// [`VersionCheck::Apply`] is [`Handled::Applied`] (the handler writes
    /// the effect, then returns it); the others as they are.
    fn from(check: VersionCheck) -> Self {
        match check {
            VersionCheck::Stale { current } => Self::Stale { current },
            VersionCheck::Gap { current } => Self::Gap { current },
            _ => Self::Applied,
        }
    }
}

impl Storable for Handled {
    fn to_stored(&self) -> Cow<'_, StoredResponse> {
        Cow::Owned(consumed_response())
    }
}

/// What the inbox stores for every message a consumer took, whatever its
/// handler found: a redelivery replays it, and only its existence
/// matters (so a batch records it with the claim, in one write).
fn consumed_response() -> StoredResponse {
    StoredResponse::new(200, "consumed")
}

/// A consumer's handler: opens the transaction its writes and the inbox
/// record share, and writes a message's effect through it.
///
/// ```
/// use idem_consumer::{Handled, Handler};
/// use idem_core::store::InboundMessage;
/// use idem_core::{HandlerError, StoreError, async_trait};
///
/// /// Counts orders; a real handler writes through a database transaction
/// /// (`PostgresStore::begin`).
/// struct Orders;
///
/// #[async_trait]
/// impl Handler for Orders {
///     type Tx = idem_core::NoTransaction;
///     async fn begin(&self) -> Result<Self::Tx, StoreError> {
///         Err(StoreError::backend("example", idem_core::Operation::Transaction, "no database"))
///     }
///     async fn handle(&self, message: &InboundMessage, tx: Self::Tx) -> Result<(Self::Tx, Handled), HandlerError> {
///         let _total: u64 = std::str::from_utf8(message.payload())?.parse()?;
///         Ok((tx, Handled::Applied))
///     }
/// }
/// # let _ = Orders;
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The transaction the handler's writes and the inbox record share.
    type Tx: Transaction;

    /// Opens it (`PostgresStore::begin`, `DynamoStore::begin`).
    async fn begin(&self) -> Result<Self::Tx, StoreError>;

    /// Writes `message`'s effect through `tx` and hands it back. An error
    /// rolls the writes back; the message is delivered again, then parked.
    async fn handle(
        &self,
        message: &InboundMessage,
        tx: Self::Tx,
    ) -> Result<(Self::Tx, Handled), HandlerError>;

    /// Writes the effects of a batch's messages through `tx` and answers
    /// what each was, in their order, as [`handle`](Self::handle) would
    /// one after another: override it to write them at once (one
    /// multi-row statement). The messages are of distinct aggregates, in
    /// delivery order. The default handles them one by one.
    ///
    /// The consumer calls it where savepoints cost a round trip
    /// ([`Transaction::free_savepoints`] is false) and nothing has to be
    /// undone yet. An error, or a [`Handled::Gap`], drops the whole
    /// transaction; the batch then begins again with each message through
    /// [`handle`](Self::handle) under a savepoint of its own, so a failure
    /// stays its message's and a gap may have written what it likes.
    ///
    /// ```
    /// use idem_consumer::{Handled, Handler};
    /// use idem_core::store::InboundMessage;
    /// use idem_core::{HandlerError, StoreError, async_trait};
    ///
    /// /// Sums what each batch carries in one write.
    /// struct Totals;
    ///
    /// #[async_trait]
    /// impl Handler for Totals {
    ///     type Tx = idem_core::NoTransaction;
    ///     async fn begin(&self) -> Result<Self::Tx, StoreError> {
    ///         Err(StoreError::backend("example", idem_core::Operation::Transaction, "no database"))
    ///     }
    ///     async fn handle(&self, message: &InboundMessage, tx: Self::Tx) -> Result<(Self::Tx, Handled), HandlerError> {
    ///         self.handle_batch(&[message], tx).await.map(|(tx, mut each)| (tx, each.remove(0)))
    ///     }
    ///     async fn handle_batch(&self, messages: &[&InboundMessage], tx: Self::Tx) -> Result<(Self::Tx, Vec<Handled>), HandlerError> {
    ///         let mut total = 0u64;
    ///         for message in messages {
    ///             total += std::str::from_utf8(message.payload())?.parse::<u64>()?;
    ///         }
    ///         // One statement adding `total` through `tx` here.
    ///         let _ = total;
    ///         Ok((tx, vec![Handled::Applied; messages.len()]))
    ///     }
    /// }
    /// # let _ = Totals;
    /// ```
    async fn handle_batch(
        &self,
        messages: &[&InboundMessage],
        mut tx: Self::Tx,
    ) -> Result<(Self::Tx, Vec<Handled>), HandlerError> {
        let mut handled = Vec::with_capacity(messages.len());
        for message in messages {
            let (next, each) = self.handle(message, tx).await?;
            tx = next;
            handled.push(each);
        }
        Ok((tx, handled))
    }
}

/// How the consumer settled one delivery with its broker: acknowledged
/// (applied, stale, a duplicate, parked) or given back to be delivered
/// again (retried, in progress elsewhere). The consumer decides it from the
/// handler's verdict (a [`Handled`], which only a handler returns), the
/// inbox and the commit; [`Consumer::consume`] and the batch calls answer
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Applied and committed, then acknowledged.
    Applied,
    /// Found stale by its version check: acknowledged, nothing written.
    Stale,
    /// Applied before (its inbox record): acknowledged, nothing written.
    Duplicate,
    /// Failed, or a gap: to be delivered again after `after`.
    Retried {
        /// The delay asked of the broker.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// Being handled elsewhere (another delivery holds its inbox claim):
    /// to be delivered again after `after`.
    InProgress {
        /// The delay asked of the broker.
        after: Duration,
    },
    /// Parked, with the reason, and acknowledged.
    Parked {
        /// Why.
        reason: String,
    },
}

impl Settled {
    /// The outcome's name, as spans and metrics carry it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Duplicate => "duplicate",
            Self::Retried { .. } => "retried",
            Self::InProgress { .. } => "in_progress",
            Self::Parked { .. } => "parked",
        }
    }
}

/// Why a consumer stopped or refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// A figure of the consumer or the broker breaks the contract: the
    /// message names it and what it must be.
    #[error("consumer misconfigured: {figure}: {message}")]
    Misconfigured {
        /// The figure too short (or unbounded).
        figure: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The inbox or the parking store failed; the delivery is left to the
    /// broker's redelivery.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// A message consumer with an inbox: per delivery, the message id is
/// claimed, scoped by the consumer's name, and the handler's writes and
/// the inbox record commit in one transaction
/// ([`Idempotency::run_in`]); only then is the delivery acknowledged. A
/// redelivery of an applied message finds its record and is acknowledged
/// with no effect, so the effect happens once however often the broker
/// delivers (a consumer killed between its commit and its ack included).
/// [`run`](Self::run) does the same for a batch of deliveries with one
/// commit ([`consume_batch`](Self::consume_batch)).
///
/// Only the consumer decides that a message is done: applied (or found
/// stale), acknowledged as a duplicate, or parked with its reason. The
/// broker never drops one ([`check`](Self::check) refuses a broker that
/// limits its deliveries).
///
/// - A handler error, a failed commit or a version gap rolls the writes
///   back and asks the broker for the message again after a back-off
///   ([`ConsumerOptions::backoff`]); at its
///   [`max_deliveries`](ConsumerOptions::max_deliveries)th failed attempt,
///   by the consumer's own count (a delivery no consumer settled does not
///   count), it is parked with the reason and acknowledged. A message
///   whose id comes with another payload is parked at once.
/// - A delivery whose inbox claim another delivery holds waits out that
///   claim's lease, without counting toward parking.
/// - When the inbox or parking store fails, the delivery is left to the
///   broker, never parked for it.
/// - After an event with a version is applied (or found a duplicate), and
///   after a gap is parked, the parked versions of its aggregate are
///   replayed in order while they apply ([`release`](Self::release)), so
///   a gap parked while its predecessor was being applied is never left
///   behind; [`run`](Self::run) sweeps for aggregates still stuck behind a
///   gap ([`stuck`](Self::stuck)). Operators list
///   ([`parked`](Self::parked)), replay ([`replay`](Self::replay)) or drop
///   ([`drop_parked`](Self::drop_parked)) parked messages.
/// - [`check`](Self::check) refuses an inbox retention shorter than the
///   broker's redelivery horizon; [`run`](Self::run) checks before the
///   first delivery.
///
/// Each delivery is an INFO span, `idem.consume`, with `consumer`,
/// `message_hash` (a hash of the message id, never the id), `kind`,
/// `deliveries` and `outcome`; with the `metrics` feature the consumer
/// counts outcomes ([`MESSAGES`](crate::MESSAGES)) and measures the lag
/// ([`LAG`](crate::LAG)).
///
/// A `Consumer` is a cheap handle: clones share one consumer.
pub struct Consumer<H> {
    parts: Arc<Parts<H>>,
}

struct Parts<H> {
    name: ConsumerName,
    idem: Idempotency,
    parking: Arc<dyn ParkingStore>,
    handler: H,
    options: ConsumerOptions,
    failures: crate::failures::Failures,
    /// How often a held delivery is said to be in progress, in
    /// milliseconds (a third of the ack wait of the source `run` runs
    /// over; 0 for never).
    keep_alive_millis: std::sync::atomic::AtomicU64,
}

impl<H> Clone for Consumer<H> {
    fn clone(&self) -> Self {
        Self {
            parts: Arc::clone(&self.parts),
        }
    }
}

impl<H> fmt::Debug for Consumer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.parts.name)
            .field("inbox", &self.parts.idem)
            .field("parking", &self.parts.parking)
            .field("options", &self.parts.options)
            .finish_non_exhaustive()
    }
}

impl<H> Consumer<H> {
    /// How often a held delivery is said to be in progress, if at all.
    fn keep_alive_every(&self) -> Option<Duration> {
        let millis = self
            .parts
            .keep_alive_millis
            .load(std::sync::atomic::Ordering::Relaxed);
        (millis > 0).then(|| Duration::from_millis(millis))
    }

    /// `work`, while every held delivery of `held` is said to be in
    /// progress each [`keep_alive_every`](Self::keep_alive_every); a broker
    /// that does not answer is only logged (its copy is a duplicate).
    async fn keeping<D: Delivery + ?Sized, T>(
        &self,
        held: &[&D],
        work: impl Future<Output = T>,
    ) -> T {
        let Some(every) = self.keep_alive_every() else {
            return work.await;
        };
        tokio::pin!(work);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = ticks.tick() => keep_alive(held).await,
            }
        }
    }
}

/// Says each delivery of `held` is in progress, all at once.
async fn keep_alive<D: Delivery + ?Sized>(held: &[&D]) {
    let said = futures_util::future::join_all(held.iter().map(|delivery| delivery.in_progress()));
    if let Some(error) = said.await.into_iter().find_map(Result::err) {
        tracing::warn!(%error, "could not tell the broker a delivery is still held");
    }
}

impl<H: Handler> Consumer<H> {
    /// A consumer named `name` (a [`ConsumerName`]: one per consuming
    /// service; its inbox records are kept under the tenant of that name,
    /// [`ConsumerName::inbox_tenant`]) with the default options.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad name.
    pub fn new(
        name: &str,
        inbox: Arc<dyn IdempotencyStore>,
        parking: Arc<dyn ParkingStore>,
        handler: H,
    ) -> Result<Self, InvalidInput> {
        Self::with_options(name, inbox, parking, handler, ConsumerOptions::default())
    }

    /// A consumer built from `options`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad name, no deliveries, a back-off whose
    /// first delay exceeds its longest, or a lease or retention out of
    /// range.
    pub fn with_options(
        name: &str,
        inbox: Arc<dyn IdempotencyStore>,
        parking: Arc<dyn ParkingStore>,
        handler: H,
        options: ConsumerOptions,
    ) -> Result<Self, InvalidInput> {
        let name = ConsumerName::new(name)?;
        let options = options.validated()?;
        let idem = Idempotency::new(inbox)
            .with_lease(options.lease)?
            .with_retention(options.retention)?;
        Ok(Self {
            parts: Arc::new(Parts {
                name,
                idem,
                parking,
                handler,
                options,
                failures: crate::failures::Failures::default(),
                keep_alive_millis: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// The consumer's name.
    pub fn name(&self) -> &ConsumerName {
        &self.parts.name
    }

    /// The longest a broker with `horizon` may take, from a message's
    /// first delivery, to deliver it for the last time, given this
    /// consumer's own delays: the consumer parks a failing message at its
    /// own count of failed attempts
    /// ([`max_deliveries`](ConsumerOptions::max_deliveries)), and each
    /// delivery in between may wait the broker's ack wait, the consumer's
    /// delay or the broker's back-off, whichever is longest. A delivery
    /// that no consumer settles (a consumer that died) adds an ack wait
    /// more each time, without bound: the figure assumes consumers that
    /// run.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Misconfigured`] when the broker limits its
    /// deliveries: it counts copies no consumer settled (one held past
    /// the ack wait, one dropped with its consumer) and drops the message
    /// at its limit, neither applied nor parked. Only the consumer decides
    /// that a message is done.
    pub fn horizon(&self, horizon: &RedeliveryHorizon) -> Result<Duration, ConsumerError> {
        let parks_at = self.parts.options.max_deliveries;
        if let Some(max) = horizon.max_deliveries {
            return Err(ConsumerError::Misconfigured {
                figure: "max deliveries",
                message: format!(
                    "{} drops a message after {max} deliveries, counting copies no consumer \
                     settled, so a message could end neither applied nor parked: let it \
                     deliver without limit (the consumer parks a failing message after its \
                     own {parks_at} failed attempts)",
                    horizon.broker
                ),
            });
        }
        // Between two deliveries: the broker's ack wait (a consumer that
        // died), the consumer's own delay, or the broker's back-off,
        // whichever is longest.
        let gap = |delivery: u32| {
            let index = usize::try_from(delivery - 1).unwrap_or(usize::MAX);
            let backoff = horizon
                .backoff
                .get(index)
                .or(horizon.backoff.last())
                .copied()
                .unwrap_or_default();
            horizon
                .ack_wait
                .max(self.parts.options.delay_after(delivery))
                .max(backoff)
        };
        // Past the broker's listed delays and the consumer's doublings
        // (at most 32), every gap is the last one: summed at once, so a
        // count of billions of attempts costs no more than one of forty.
        let listed = u32::try_from(horizon.backoff.len()).unwrap_or(u32::MAX);
        let varying = parks_at.min(listed.saturating_add(33));
        let mut total = Duration::ZERO;
        for delivery in 1..varying {
            total = total.saturating_add(gap(delivery));
        }
        if varying < parks_at {
            total = total.saturating_add(gap(varying).saturating_mul(parks_at - varying));
        }
        Ok(total.saturating_add(horizon.ack_wait))
    }

    /// Checks the inbox's retention against a broker's redelivery horizon.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Misconfigured`] naming the figure: the retention
    /// shorter than the redelivery horizon or the duplicate window, or the
    /// broker's deliveries as [`horizon`](Self::horizon) says.
    pub fn check(&self, horizon: &RedeliveryHorizon) -> Result<(), ConsumerError> {
        let retention = self.parts.options.retention;
        let longest = self.horizon(horizon)?;
        if retention < longest {
            return Err(ConsumerError::Misconfigured {
                figure: "inbox retention",
                message: format!(
                    "{retention:?} is shorter than {}'s redelivery horizon of {longest:?} \
                     ({} attempts, ack wait {:?}): a late redelivery would be applied again",
                    horizon.broker, self.parts.options.max_deliveries, horizon.ack_wait
                ),
            });
        }
        if let Some(window) = horizon.duplicate_window.filter(|w| retention < *w) {
            return Err(ConsumerError::Misconfigured {
                figure: "inbox retention",
                message: format!(
                    "{retention:?} is shorter than {}'s duplicate window of {window:?}: \
                     a message published again inside the window would be applied again",
                    horizon.broker
                ),
            });
        }
        Ok(())
    }
}
