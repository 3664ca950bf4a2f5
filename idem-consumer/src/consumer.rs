//! The consumer's rules: per delivery, the inbox claim and the handler's
//! writes in one transaction, then the acknowledgement; redelivery with
//! back-off, parking, replay, and the check of retention against the
//! broker's horizon.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, InboundMessage, Lease, NewParked, ParkedMessage,
    ParkedQuery, ParkingStore, Resolution, Transaction, VersionCheck,
};
use idem_core::{
    Fingerprint, HandlerError, Idempotency, IdempotencyKey, InvalidInput, RunError, RunOutcome,
    Scope, Storable, StoreError, StoredResponse, Tenant, Verdict, async_trait,
};
use tracing::{Instrument, field};

use crate::delivery::{BrokerError, Delivery, RedeliveryHorizon, Source};
use crate::flight::{Lanes, Tasks};

/// The deliveries being handled, each task ending in how it went.
type Handling = Tasks<Result<(), ConsumerError>>;
/// A handled batch's aggregates and how its task ended.
type Joined = crate::flight::Joined<Result<(), ConsumerError>>;
use crate::options::ConsumerOptions;

/// What [`Consumer::run`] holds: the lanes of the deliveries received, the
/// batches being handled, and the batch being gathered.
struct Flight<D> {
    lanes: Lanes<D>,
    tasks: Handling,
    /// Deliveries free to start, each with its aggregate, oldest first.
    gathered: Vec<(Option<String>, D)>,
    /// When the gathered batch starts, full or not.
    due: Option<tokio::time::Instant>,
}

/// Why a message's claim was refused for good.
const MISMATCH: &str = "its message id was consumed before with another payload";

/// Whether a message is in the batch twice.
fn repeats(messages: &[&InboundMessage]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(messages.len());
    !messages.iter().all(|message| seen.insert(message.id()))
}

/// A store that answered another count of outcomes than it was asked for.
fn miscounted(operation: &'static str) -> StoreError {
    StoreError::backend(
        "transaction",
        idem_core::Operation::Claim,
        format!("{operation} answered another count of outcomes than of requests"),
    )
}

/// How a version gap's reason begins: the consumer writes it when it parks
/// a gap, and reads it to tell a parked gap from a failure.
const GAP: &str = "version gap: the aggregate is at ";

fn gap(current: u64, message: &InboundMessage) -> String {
    format!(
        "{GAP}{current}, the event at {}",
        message.version().unwrap_or_default()
    )
}

/// The version a parked gap's aggregate was at, if `reason` is a gap's.
pub(crate) fn gap_behind(reason: &str) -> Option<u64> {
    let rest = reason.strip_prefix(GAP)?;
    rest.split(',').next()?.parse().ok()
}

/// How one pass of a batch through its transaction ended.
enum Round {
    /// Committed: the messages it took are settled; those that did not fit
    /// ([`Transaction::fits`]) go on in the next transaction.
    Committed,
    /// A handler failed, taking the transaction with it: its message's
    /// attempt is settled, and the batch begins again without it.
    HandlerFailed,
    /// The transaction was refused (begun, claimed in, rolled back to a
    /// savepoint, or committed): each message on its own instead.
    Refused(StoreError),
    /// The handler's transaction does not batch.
    Unbatched,
    /// A message must be undone alone, and the pass took no savepoints:
    /// the batch begins again with one per message.
    Undo,
}

/// The refusal of a batch whose first message alone does not fit one
/// transaction: it is handled on its own instead, where its commit says why.
fn alone_too_large() -> StoreError {
    idem_core::InvalidInput::OutOfRange {
        field: "transaction",
        reason: "one message's writes do not fit the batch's transaction",
    }
    .into()
}

/// How one message of a batch went in the batch's transaction.
enum Step<Tx> {
    /// Done (or rolled back to its savepoint): the transaction goes on.
    Kept(Tx, Attempt),
    /// The handler failed and dropped the transaction.
    HandlerFailed(String),
    /// The transaction is no longer to be trusted.
    Refused(StoreError),
    /// The message's writes made the transaction too large
    /// ([`Transaction::fits`]); they were rolled back to its savepoint.
    Full(Tx),
}

/// How many received deliveries may wait behind their aggregates per slot
/// of [`ConsumerOptions::concurrency`] before [`Consumer::run`] stops
/// receiving.
pub const WAITING_PER_SLOT: usize = 8;

/// What a handler found a message to be, after its writes.
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
        // What a redelivery replays; only its existence matters.
        Cow::Owned(StoredResponse::new(200, "consumed"))
    }
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

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Consumed {
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

impl Consumed {
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

fn log_handled(handled: Result<Result<(), ConsumerError>, tokio::task::JoinError>) {
    match handled {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "a delivery failed; the broker delivers it again");
        }
        Err(error) => {
            tracing::error!(%error, "a delivery's task ended abnormally; the broker delivers it again");
        }
    }
}

/// An aggregate whose oldest parked version is a version gap
/// ([`Consumer::stuck`]): it waits for a version that no parked message
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stuck {
    /// The aggregate.
    pub aggregate: String,
    /// The version it was at when its oldest parked version was parked.
    pub at: u64,
    /// The version its parked messages wait for: the one after
    /// [`at`](Self::at).
    pub waiting_for: u64,
    /// Its oldest parked version.
    pub oldest_parked: u64,
    /// How many of its messages are parked (up to
    /// [`MAX_OUTBOX_BATCH`](idem_core::store::MAX_OUTBOX_BATCH)).
    pub parked: usize,
    /// When its oldest parked version was (last) parked.
    pub since: idem_core::store::Timestamp,
}

impl Stuck {
    /// The stuck aggregates of `consumer` in `parking`, as
    /// [`Consumer::stuck`] finds them (for a tool that has the parking
    /// store and not the consumer): among its `limit` oldest parked
    /// messages, one listing, then one per aggregate found.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn find(
        parking: &dyn ParkingStore,
        consumer: &Tenant,
        limit: usize,
    ) -> Result<Vec<Self>, StoreError> {
        let oldest = parking
            .parked(&ParkedQuery::new(consumer.clone()).limit(limit))
            .await?;
        let mut seen = std::collections::HashSet::new();
        let mut stuck = Vec::new();
        for entry in &oldest {
            let message = &entry.parked.message;
            let (Some(aggregate), Some(_)) = (message.aggregate(), message.version()) else {
                continue;
            };
            if !seen.insert(aggregate) {
                continue;
            }
            let query = ParkedQuery::new(consumer.clone())
                .of_aggregate(aggregate)
                .limit(idem_core::store::MAX_OUTBOX_BATCH);
            let own = parking.parked(&query).await?;
            let Some(first) = own.first() else { continue };
            let (Some(at), Some(version)) = (
                gap_behind(&first.parked.reason),
                first.parked.message.version(),
            ) else {
                continue;
            };
            stuck.push(Self {
                aggregate: aggregate.to_string(),
                at,
                waiting_for: at.saturating_add(1),
                oldest_parked: version,
                parked: own.len(),
                since: first.parked_at,
            });
        }
        Ok(stuck)
    }
}

/// A task aborted when this guard drops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a delivery was settled, short of its ack.
struct Settlement {
    consumed: Consumed,
    /// Whether it is to be acknowledged.
    ack: bool,
    /// Whether its aggregate's parked later versions are to be replayed.
    release: bool,
}

impl Settlement {
    /// Asked of the broker again: not acknowledged, nothing released.
    fn unacked(consumed: Consumed) -> Self {
        Self {
            consumed,
            ack: false,
            release: false,
        }
    }
}

/// How one attempt at a message ended, before the delivery is settled.
enum Attempt {
    Done(Consumed),
    /// The message's fault: counts toward parking.
    Failed(String),
    /// A version gap: counts toward parking; parked, its aggregate is
    /// released, as its predecessor may have applied meanwhile.
    Gap(String),
    /// Not the message's fault (the store): delivered again, never parked.
    Unavailable(StoreError),
    Busy(Duration),
    /// Never applicable (its id was seen with another payload): parked now.
    Poison(String),
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
    name: Tenant,
    idem: Idempotency,
    parking: Arc<dyn ParkingStore>,
    handler: H,
    options: ConsumerOptions,
    failures: crate::failures::Failures,
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

impl<H: Handler> Consumer<H> {
    /// A consumer named `name` (its inbox's tenant: one name per consuming
    /// service) with the default options.
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
        let name = Tenant::new(name)?;
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
            }),
        })
    }

    /// The consumer's name.
    pub fn name(&self) -> &Tenant {
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

    /// Checks the horizon of `source`, then consumes its deliveries until
    /// it closes or `shutdown` completes, in batches
    /// ([`ConsumerOptions::batch`]): the deliveries received within the
    /// batch's wait, up to its size, are handled in one transaction and
    /// committed once ([`consume_batch`](Self::consume_batch)), up to
    /// [`ConsumerOptions::concurrency`] batches at once. Never two
    /// deliveries of one aggregate are handled at the same time, and each
    /// aggregate's in the order the source delivered them (so version
    /// checks see them in order; a message without an aggregate waits only
    /// for room). A delivery of an aggregate being handled waits behind it,
    /// outside any batch, so a slow aggregate holds up only its own and its
    /// batch-mates (which commit with it); `run` stops receiving while
    /// [`WAITING_PER_SLOT`] deliveries per slot
    /// ([`ConsumerOptions::slots`]) wait so. A retryable broker error
    /// receiving (a lost connection, a timeout) is logged and asked again
    /// after the consumer's back-off, doubling while it lasts.
    ///
    /// # Cancellation
    ///
    /// Each batch is handled in a task of its own, so that it commits whole
    /// or rolls back whole and is then settled, whatever becomes of `run`:
    /// dropping `run`'s future (or aborting its task) stops the receiving,
    /// never a batch between its statements. When `shutdown` completes,
    /// `run` stops receiving and waits for the batches being handled, up to
    /// [`ConsumerOptions::shutdown_grace`]; deliveries received and not
    /// begun are left unsettled, for the broker to deliver again. A process
    /// that dies mid-batch leaves its transaction to roll back and its
    /// deliveries to the broker, which delivers them again.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Misconfigured`] from [`check`](Self::check), before
    /// any delivery; a broker error receiving that is not retryable (once
    /// the batches being handled are done). A failure of one delivery is
    /// logged and left to the broker's redelivery.
    pub async fn run<S: Source>(
        &self,
        source: &mut S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumerError> {
        self.check(&source.horizon())?;
        let _sweeper = self.sweeper();
        tokio::pin!(shutdown);
        let slots = self.parts.options.slots();
        let mut flight = Flight {
            lanes: Lanes::new(slots, slots.saturating_mul(WAITING_PER_SLOT)),
            tasks: Handling::default(),
            gathered: Vec::new(),
            due: None,
        };
        // Receive failures in a row: the back-off's delivery count.
        let mut failures = 0u32;
        loop {
            // Until there is room: only settle what is handled.
            while !flight.lanes.has_room() {
                let (flushable, due) = self.flush_due(&flight);
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        self.finish(flight.tasks).await;
                        return Ok(());
                    }
                    Some(joined) = flight.tasks.join_next() => self.joined(&mut flight, joined),
                    () = tokio::time::sleep_until(due), if flushable => self.flush(&mut flight),
                    // Nothing runs, so nothing would make room: receive.
                    else => break,
                }
            }
            // One receive, never dropped for a settlement (a source's next
            // need not be cancel-safe), only for the shutdown, as before.
            let Some(next) = self
                .meanwhile(&mut flight, &mut shutdown, source.next())
                .await
            else {
                return Ok(());
            };
            let next = match next {
                Ok(next) => next,
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    let after = self.parts.options.delay_after(failures);
                    tracing::warn!(%error, ?after, "the source could not receive; asking again");
                    let resume = tokio::time::sleep(after);
                    if self
                        .meanwhile(&mut flight, &mut shutdown, resume)
                        .await
                        .is_none()
                    {
                        return Ok(());
                    }
                    continue;
                }
                Err(error) => {
                    self.drain(&mut flight, &mut shutdown).await;
                    return Err(error.into());
                }
            };
            failures = 0;
            let Some(delivery) = next else {
                self.drain(&mut flight, &mut shutdown).await;
                return Ok(());
            };
            let aggregate = delivery.message().aggregate().map(str::to_string);
            if let Some(delivery) = flight.lanes.admit(aggregate.clone(), delivery) {
                self.gather(&mut flight, aggregate, delivery);
            }
        }
    }

    /// Awaits `work` while settling the batches that end and starting a
    /// gathered one whose wait is up; `None` when `shutdown` completed
    /// first (the batches being handled then finish, within the grace).
    async fn meanwhile<D: Delivery + 'static, T>(
        &self,
        flight: &mut Flight<D>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            let (flushable, due) = self.flush_due(flight);
            tokio::select! {
                biased;
                () = &mut *shutdown => {
                    self.finish(std::mem::take(&mut flight.tasks)).await;
                    return None;
                }
                Some(joined) = flight.tasks.join_next() => self.joined(flight, joined),
                () = tokio::time::sleep_until(due), if flushable => self.flush(flight),
                done = &mut work => return Some(done),
            }
        }
    }

    /// Whether a gathered batch may start when its wait is up, and when
    /// that is (a batch task must be free).
    fn flush_due<D>(&self, flight: &Flight<D>) -> (bool, tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        match flight.due {
            Some(due) if flight.tasks.len() < self.parts.options.concurrency => (true, due),
            _ => (false, now),
        }
    }

    /// A delivery may start: it joins the batch being gathered, which
    /// starts once full (and a batch task is free).
    fn gather<D: Delivery + 'static>(
        &self,
        flight: &mut Flight<D>,
        aggregate: Option<String>,
        delivery: D,
    ) {
        if flight.gathered.is_empty() {
            flight.due = Some(tokio::time::Instant::now() + self.parts.options.batch_wait);
        }
        flight.gathered.push((aggregate, delivery));
        let options = &self.parts.options;
        while flight.gathered.len() >= options.batch_size
            && flight.tasks.len() < options.concurrency
        {
            self.start(flight);
        }
    }

    /// The gathered batch's wait is up: it starts as it is.
    fn flush<D: Delivery + 'static>(&self, flight: &mut Flight<D>) {
        if flight.tasks.len() < self.parts.options.concurrency {
            self.start(flight);
        }
    }

    /// Starts a batch of the gathered deliveries (the oldest, up to the
    /// batch size) in a task of its own.
    fn start<D: Delivery + 'static>(&self, flight: &mut Flight<D>) {
        let size = flight.gathered.len().min(self.parts.options.batch_size);
        if size == 0 {
            flight.due = None;
            return;
        }
        let (aggregates, batch): (Vec<_>, Vec<_>) = flight.gathered.drain(..size).unzip();
        if flight.gathered.is_empty() {
            flight.due = None;
        }
        let consumer = self.clone();
        flight.tasks.spawn(aggregates, async move {
            for settled in consumer.consume_batch(&batch).await {
                if let Err(error) = settled {
                    tracing::warn!(%error, "a delivery failed; the broker delivers it again");
                }
            }
            Ok(())
        });
    }

    /// A batch's task ended: logs how, and gathers what waited for it.
    fn joined<D: Delivery + 'static>(&self, flight: &mut Flight<D>, joined: Joined) {
        let (aggregates, handled) = joined;
        log_handled(handled);
        for aggregate in aggregates {
            for (aggregate, delivery) in flight.lanes.finished(aggregate.as_deref()) {
                self.gather(flight, aggregate, delivery);
            }
        }
        // A batch task is free: a batch whose wait is up starts now.
        if flight
            .due
            .is_some_and(|due| due <= tokio::time::Instant::now())
        {
            self.flush(flight);
        }
    }

    /// The source closed (or failed for good): handles what was received,
    /// until the shutdown.
    async fn drain<D: Delivery + 'static>(
        &self,
        flight: &mut Flight<D>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) {
        while !flight.lanes.is_idle() {
            let (flushable, due) = self.flush_due(flight);
            tokio::select! {
                biased;
                () = &mut *shutdown => {
                    self.finish(std::mem::take(&mut flight.tasks)).await;
                    return;
                }
                Some(joined) = flight.tasks.join_next() => self.joined(flight, joined),
                () = tokio::time::sleep_until(due), if flushable => self.flush(flight),
                else => return,
            }
        }
    }

    /// At shutdown: waits for the batches being handled, within the grace.
    async fn finish(&self, mut tasks: Handling) {
        let grace = self.parts.options.shutdown_grace;
        let finished = tokio::time::timeout(grace, async {
            while let Some((_, handled)) = tasks.join_next().await {
                log_handled(handled);
            }
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                ?grace,
                "deliveries were still being handled at the end of the shutdown grace; \
                 they finish in their tasks, or the broker delivers them again"
            );
        }
    }

    /// Consumes one delivery and settles it.
    ///
    /// Dropped mid-way (as a process dies), its transaction rolls back, its
    /// inbox claim is released (see
    /// [`Idempotency::run_in`](idem_core::Idempotency::run_in)) and the
    /// delivery stays unsettled, so the broker delivers it again; what
    /// committed never lacks its settlement's effect (a redelivery of it is
    /// a duplicate). [`run`](Self::run) runs each delivery in a task of its
    /// own, so dropping `run` never cuts one.
    ///
    /// # Errors
    ///
    /// A store or broker failure: the delivery is then unsettled (or asked
    /// for again) and the broker delivers it again.
    pub async fn consume<D: Delivery + ?Sized>(
        &self,
        delivery: &D,
    ) -> Result<Consumed, ConsumerError> {
        let span = self.delivery_span(delivery);
        let result = self.settle(delivery).instrument(span.clone()).await;
        self.settled(&span, delivery, &result);
        result
    }

    async fn settle<D: Delivery + ?Sized>(&self, delivery: &D) -> Result<Consumed, ConsumerError> {
        let attempt = self.attempt(delivery.message()).await;
        let settlement = self.settle_attempt(delivery, attempt).await?;
        // Released whether or not the ack gets through: what committed (or
        // parked) stands either way.
        let acked = match settlement.ack {
            true => delivery.ack().await,
            false => Ok(()),
        };
        if settlement.release {
            self.release_behind(delivery.message()).await;
        }
        acked?;
        Ok(settlement.consumed)
    }

    /// Consumes a batch of deliveries (of one source, in its order, no two
    /// of one aggregate) with one commit, and settles each: every message
    /// is claimed in one transaction of the handler's
    /// ([`Transaction::claim`]) and handled under a savepoint of its own,
    /// then the transaction commits once and the deliveries are
    /// acknowledged together ([`Delivery::ack_all`]). Where a savepoint
    /// costs a round trip ([`Transaction::free_savepoints`] is false:
    /// Postgres) the batch first goes at once, with no savepoint: one
    /// claim of its messages ([`Transaction::claim_all`]), one call of
    /// [`Handler::handle_batch`], one completion of them all
    /// ([`Transaction::complete_all`]), one commit; only if a message must
    /// be undone alone (a handler error, a gap, a refused completion) does
    /// it begin again one message at a time, as below. A message twice in
    /// the batch sends it one at a time from the start.
    ///
    /// - A message whose handler returns a gap, whose claim finds it
    ///   applied, held or consumed with another payload, or whose
    ///   completion is refused is rolled back to its savepoint; its
    ///   batch-mates go on.
    /// - A handler error drops the transaction it was given (the handler
    ///   owns it): the batch begins again without that message, which is
    ///   delivered again, then parked, as on its own.
    /// - A refused commit (a serialization failure, a deferred constraint,
    ///   an outcome unknown) or a refused savepoint or claim hands each
    ///   message to [`consume`](Self::consume)'s path, one transaction
    ///   each, so one bad message never keeps its batch-mates from
    ///   applying (one whose commit landed is then a duplicate).
    /// - A duplicate inside the batch applies once: its claim finds the
    ///   first completed in the same transaction. A message claimed in two
    ///   batches at once applies once: the store makes the second claim
    ///   wait for the first transaction, then find it applied (Postgres, on
    ///   the record's primary key), or answer it held.
    ///
    /// A handler transaction that does not batch ([`Transaction::batches`])
    /// has each delivery consumed on its own, all at once. Results are in
    /// the batch's order. The batch is an INFO span, `idem.consume_batch`,
    /// with `consumer`, `size` and `commits`; each delivery's settlement
    /// an `idem.consume` span as [`consume`](Self::consume)'s.
    pub async fn consume_batch<D: Delivery>(
        &self,
        batch: &[D],
    ) -> Vec<Result<Consumed, ConsumerError>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let span = tracing::info_span!(
            "idem.consume_batch",
            consumer = %self.parts.name,
            size = batch.len(),
            commits = field::Empty,
        );
        let _in_flight = crate::InFlight::new(&self.parts.name, batch.len());
        async {
            let messages: Vec<&InboundMessage> = batch.iter().map(Delivery::message).collect();
            let Some(attempts) = self.attempt_batch(&messages).await else {
                let each = batch.iter().map(|delivery| self.consume(delivery));
                return futures_util::future::join_all(each).await;
            };
            self.settle_batch(batch, attempts).await
        }
        .instrument(span)
        .await
    }

    /// Each message's attempt in one transaction; `None` when the
    /// handler's transaction does not batch.
    async fn attempt_batch(&self, messages: &[&InboundMessage]) -> Option<Vec<Attempt>> {
        let mut settled: Vec<Option<Attempt>> = messages.iter().map(|_| None).collect();
        let mut commits = 0u64;
        // At once until a message has to be undone alone; one by one from
        // the start if a message is in the batch twice (its second claim
        // must find the first completed).
        let mut careful = repeats(messages);
        // Each pass settles at least one message (a handler error settles
        // its message; a commit at least the first it took), but for the
        // one pass that turns careful, so at most as many passes as the
        // batch has messages, and two more.
        let refused = loop {
            commits += 1;
            match self.batch_round(messages, &mut settled, careful).await {
                Round::Committed if settled.iter().all(Option::is_some) => {
                    tracing::Span::current().record("commits", commits);
                    return Some(settled.into_iter().flatten().collect());
                }
                Round::Committed | Round::HandlerFailed => {}
                Round::Undo => careful = true,
                Round::Unbatched => return None,
                Round::Refused(error) => break error,
            }
        };
        tracing::warn!(
            error = %refused,
            size = messages.len(),
            "a batch's transaction was refused; its messages are handled one by one"
        );
        let mut attempts = Vec::with_capacity(messages.len());
        for (message, settled) in messages.iter().zip(settled) {
            let attempt = match settled {
                Some(attempt) => attempt,
                None => {
                    commits += 1;
                    self.attempt(message).await
                }
            };
            attempts.push(attempt);
        }
        tracing::Span::current().record("commits", commits);
        Some(attempts)
    }

    /// One pass of the batch's messages not yet settled through one
    /// transaction: one by one under savepoints if `careful` or where
    /// savepoints are free ([`Transaction::free_savepoints`]), else at
    /// once.
    async fn batch_round(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        careful: bool,
    ) -> Round {
        let tx = match self.parts.handler.begin().await {
            Ok(tx) => tx,
            Err(error) => return Round::Refused(error),
        };
        if !tx.batches() {
            return Round::Unbatched;
        }
        if careful || tx.free_savepoints() {
            self.one_by_one(messages, settled, tx).await
        } else {
            self.at_once(messages, settled, tx).await
        }
    }

    /// The messages not yet settled, each under a savepoint of its own.
    async fn one_by_one(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        mut tx: H::Tx,
    ) -> Round {
        let mut done: Vec<(usize, Attempt)> = Vec::new();
        for (at, message) in messages.iter().enumerate() {
            if settled[at].is_some() {
                continue;
            }
            match self.batch_step(message, tx).await {
                Step::Kept(kept, attempt) => {
                    tx = kept;
                    done.push((at, attempt));
                }
                Step::Full(kept) if !done.is_empty() => {
                    tx = kept;
                    break;
                }
                Step::Full(_) => return Round::Refused(alone_too_large()),
                Step::HandlerFailed(reason) => {
                    settled[at] = Some(Attempt::Failed(reason));
                    return Round::HandlerFailed;
                }
                Step::Refused(error) => return Round::Refused(error),
            }
        }
        Self::commit_round(tx, done, settled).await
    }

    /// The messages not yet settled at once, with no savepoint: one claim
    /// of them all ([`Transaction::claim_all`]), one call of the handler
    /// ([`Handler::handle_batch`]), one completion of them all
    /// ([`Transaction::complete_all`]), one commit. A message that has to
    /// be undone alone (a handler error, a gap, a refused completion, a
    /// transaction grown too large) drops it all: [`Round::Undo`].
    async fn at_once(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        mut tx: H::Tx,
    ) -> Round {
        let open: Vec<usize> = (0..messages.len())
            .filter(|at| settled[*at].is_none())
            .collect();
        let mut requests = Vec::with_capacity(open.len());
        for at in &open {
            match self.claim_request(messages[*at]) {
                Ok(request) => requests.push(request),
                Err(error) => return Round::Refused(error),
            }
        }
        let outcomes = match tx.claim_all(&requests).await {
            Ok(outcomes) if outcomes.len() == requests.len() => outcomes,
            Ok(_) => return Round::Refused(miscounted("claim_all")),
            Err(error) => return Round::Refused(error),
        };
        let mut done: Vec<(usize, Attempt)> = Vec::new();
        let mut claimed: Vec<(usize, Lease)> = Vec::new();
        for (at, outcome) in open.into_iter().zip(outcomes) {
            match outcome {
                ClaimOutcome::Claimed { lease, .. } => claimed.push((at, lease)),
                // The claim wrote nothing to keep.
                other => done.push((at, self.unclaimed(other))),
            }
        }
        if !claimed.is_empty() {
            let batch: Vec<&InboundMessage> = claimed.iter().map(|(at, _)| messages[*at]).collect();
            let handled = match self.parts.handler.handle_batch(&batch, tx).await {
                Ok((next, handled)) if handled.len() == batch.len() => {
                    tx = next;
                    handled
                }
                // Which message failed is found one by one.
                _ => return Round::Undo,
            };
            if handled.iter().any(|h| matches!(h, Handled::Gap { .. })) {
                return Round::Undo;
            }
            let completions: Vec<(Lease, StoredResponse)> = claimed
                .iter()
                .zip(&handled)
                .map(|((_, lease), handled)| (lease.clone(), handled.to_stored().into_owned()))
                .collect();
            match tx.complete_all(&completions).await {
                Ok(()) if tx.fits() => {}
                Ok(())
                | Err(
                    StoreError::LostLease
                    | StoreError::Rejected { .. }
                    | StoreError::TooLarge { .. }
                    | StoreError::InvalidInput(_),
                ) => return Round::Undo,
                Err(error) => return Round::Refused(error),
            }
            for ((at, _), handled) in claimed.into_iter().zip(handled) {
                let consumed = match handled {
                    Handled::Applied => Consumed::Applied,
                    _ => Consumed::Stale,
                };
                done.push((at, Attempt::Done(consumed)));
            }
        }
        Self::commit_round(tx, done, settled).await
    }

    /// Commits a round's transaction, then settles what it took.
    async fn commit_round(
        tx: H::Tx,
        done: Vec<(usize, Attempt)>,
        settled: &mut [Option<Attempt>],
    ) -> Round {
        match tx.commit().await {
            Ok(()) => {
                for (at, attempt) in done {
                    settled[at] = Some(attempt);
                }
                Round::Committed
            }
            Err(error) => Round::Refused(error),
        }
    }

    /// A message's inbox claim.
    fn claim_request(&self, message: &InboundMessage) -> Result<ClaimRequest, StoreError> {
        let scope = Scope::new(self.parts.name.clone(), message.id().clone());
        ClaimRequest::new(scope, Fingerprint::of_bytes(message.payload()))
            .with_lease(self.parts.options.lease)
            .and_then(|request| request.with_retention(self.parts.options.retention))
            .map_err(StoreError::from)
    }

    /// What a claim that did not claim makes of its message.
    fn unclaimed(&self, outcome: ClaimOutcome) -> Attempt {
        match outcome {
            ClaimOutcome::Completed(_) => Attempt::Done(Consumed::Duplicate),
            ClaimOutcome::InProgress { retry_after } => Attempt::Busy(retry_after),
            ClaimOutcome::Mismatch => Attempt::Poison(MISMATCH.to_string()),
            _ => Attempt::Busy(self.parts.options.first_backoff),
        }
    }

    /// One message of a batch under its own savepoint: its claim, its
    /// handler, its completion.
    async fn batch_step(&self, message: &InboundMessage, mut tx: H::Tx) -> Step<H::Tx> {
        if let Err(error) = tx.savepoint().await {
            return Step::Refused(error);
        }
        let request = match self.claim_request(message) {
            Ok(request) => request,
            Err(error) => return Step::Refused(error),
        };
        let lease = match tx.claim(&request).await {
            Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
            Ok(other) => {
                let attempt = self.unclaimed(other);
                // The claim wrote nothing to keep.
                return match tx.release_savepoint().await {
                    Ok(()) => Step::Kept(tx, attempt),
                    Err(error) => Step::Refused(error),
                };
            }
            Err(error) => return Step::Refused(error),
        };
        let (mut tx, handled) = match self.parts.handler.handle(message, tx).await {
            Ok(handled) => handled,
            Err(error) => return Step::HandlerFailed(error.to_string()),
        };
        let attempt = match handled {
            // A gap writes nothing and leaves no claim behind.
            Handled::Gap { current } => Err(Attempt::Gap(gap(current, message))),
            handled => match tx.complete(&lease, &handled.to_stored()).await {
                Ok(()) if handled == Handled::Applied => Ok(Attempt::Done(Consumed::Applied)),
                Ok(()) => Ok(Attempt::Done(Consumed::Stale)),
                Err(StoreError::LostLease) => Err(Attempt::Busy(self.parts.options.first_backoff)),
                Err(
                    error @ (StoreError::Rejected { .. }
                    | StoreError::TooLarge { .. }
                    | StoreError::InvalidInput(_)),
                ) => Err(Attempt::Failed(error.to_string())),
                Err(error) => return Step::Refused(error),
            },
        };
        // Whatever the message came to (a version check that found its
        // aggregate written already in this transaction answers a gap),
        // a transaction it made too large goes on without it.
        if !tx.fits() {
            return match tx.rollback_to_savepoint().await {
                Ok(()) => Step::Full(tx),
                Err(error) => Step::Refused(error),
            };
        }
        let (closed, attempt) = match attempt {
            Ok(attempt) => (tx.release_savepoint().await, attempt),
            Err(attempt) => (tx.rollback_to_savepoint().await, attempt),
        };
        match closed {
            Ok(()) => Step::Kept(tx, attempt),
            Err(error) => Step::Refused(error),
        }
    }

    /// Settles a batch's deliveries after its commit: those to deliver
    /// again first, then the parked, then every acknowledgement at once.
    async fn settle_batch<D: Delivery>(
        &self,
        batch: &[D],
        attempts: Vec<Attempt>,
    ) -> Vec<Result<Consumed, ConsumerError>> {
        let mut settled = Vec::with_capacity(batch.len());
        let mut acks = Vec::new();
        let mut releases = Vec::new();
        for (at, (delivery, attempt)) in batch.iter().zip(attempts).enumerate() {
            let span = self.delivery_span(delivery);
            let result = self
                .settle_attempt(delivery, attempt)
                .instrument(span.clone())
                .await;
            if let Ok(settlement) = &result {
                if settlement.ack {
                    acks.push(at);
                }
                if settlement.release {
                    releases.push(at);
                }
            }
            settled.push((span, result.map(|settlement| settlement.consumed)));
        }
        let acked: Vec<&D> = acks.iter().map(|at| &batch[*at]).collect();
        let broker = D::ack_all(&acked).await.err();
        let mut results = Vec::with_capacity(batch.len());
        for (at, (span, result)) in settled.into_iter().enumerate() {
            let result = match (result, &broker) {
                (Ok(_), Some(error)) if acks.contains(&at) => {
                    Err(ConsumerError::Broker(error.copied()))
                }
                (result, _) => result,
            };
            self.settled(&span, &batch[at], &result);
            results.push(result);
        }
        // Whether or not the acks got through: what committed or parked
        // stands either way.
        for at in releases {
            self.release_behind(batch[at].message()).await;
        }
        results
    }

    /// Settles one attempt short of its ack: what it was, whether it is to
    /// be acknowledged, and whether its aggregate is to be released.
    ///
    /// A failure counts toward parking by the consumer's own count of
    /// failed attempts at the message ([`Failures`](crate::failures::Failures)),
    /// never by the broker's count of deliveries, which also counts copies
    /// no consumer settled.
    async fn settle_attempt<D: Delivery + ?Sized>(
        &self,
        delivery: &D,
        attempt: Attempt,
    ) -> Result<Settlement, ConsumerError> {
        let message = delivery.message();
        let failures = &self.parts.failures;
        let parks_at = self.parts.options.max_deliveries;
        let (consumed, release) = match attempt {
            Attempt::Done(consumed) => {
                failures.forget(message.id());
                // A duplicate too: the consumer that applied it may have
                // died before it released what waits behind it.
                let release = matches!(consumed, Consumed::Applied | Consumed::Duplicate);
                (consumed, release)
            }
            Attempt::Busy(after) => {
                delivery.retry(after).await?;
                return Ok(Settlement::unacked(Consumed::InProgress { after }));
            }
            Attempt::Unavailable(error) => {
                // Not the message's fault: paced by the broker's count, as
                // a store that stays away is, never parked for it.
                let after = self.parts.options.delay_after(delivery.deliveries());
                delivery.retry(after).await?;
                let reason = error.to_string();
                return Ok(Settlement::unacked(Consumed::Retried { after, reason }));
            }
            Attempt::Failed(reason) | Attempt::Gap(reason)
                if failures.count(message.id()).saturating_add(1) < parks_at =>
            {
                let after = self.parts.options.delay_after(failures.fail(message.id()));
                delivery.retry(after).await?;
                return Ok(Settlement::unacked(Consumed::Retried { after, reason }));
            }
            Attempt::Gap(reason) => {
                let tried = failures.count(message.id()).saturating_add(1);
                self.park(message, &reason, tried).await?;
                failures.forget(message.id());
                (Consumed::Parked { reason }, true)
            }
            Attempt::Failed(reason) | Attempt::Poison(reason) => {
                let tried = failures.count(message.id()).saturating_add(1);
                self.park(message, &reason, tried).await?;
                failures.forget(message.id());
                (Consumed::Parked { reason }, false)
            }
        };
        Ok(Settlement {
            consumed,
            ack: true,
            release,
        })
    }

    /// A delivery's span, `idem.consume`.
    fn delivery_span<D: Delivery + ?Sized>(&self, delivery: &D) -> tracing::Span {
        let message = delivery.message();
        tracing::info_span!(
            "idem.consume",
            consumer = %self.parts.name,
            message_hash = %message.id().redacted(),
            kind = message.kind(),
            deliveries = delivery.deliveries(),
            outcome = field::Empty,
        )
    }

    /// Records a settled delivery on its span and in the metrics.
    fn settled<D: Delivery + ?Sized>(
        &self,
        span: &tracing::Span,
        delivery: &D,
        result: &Result<Consumed, ConsumerError>,
    ) {
        match result {
            Ok(consumed) => {
                span.record("outcome", consumed.as_str());
                crate::record(&self.parts.name, consumed, delivery.published_at());
            }
            Err(_) => {
                span.record("outcome", "error");
            }
        }
    }

    async fn park(
        &self,
        message: &InboundMessage,
        reason: &str,
        deliveries: u32,
    ) -> Result<(), StoreError> {
        let parked = NewParked {
            consumer: self.parts.name.clone(),
            message: message.clone(),
            reason: reason.to_string(),
            deliveries,
        };
        self.parts.parking.park(&parked).await.map(drop)
    }

    /// One attempt: the inbox claim, the handler and the commit.
    async fn attempt(&self, message: &InboundMessage) -> Attempt {
        let scope = Scope::new(self.parts.name.clone(), message.id().clone());
        let fingerprint = Fingerprint::of_bytes(message.payload());
        let handler = &self.parts.handler;
        let run = self
            .parts
            .idem
            .run_in(scope, fingerprint, handler.begin(), |_ctx, tx| async move {
                let (tx, handled) = handler.handle(message, tx).await?;
                let verdict = match handled {
                    // A gap writes nothing and frees the claim for the
                    // next delivery.
                    Handled::Gap { .. } => Verdict::Release(handled),
                    _ => Verdict::Store(handled),
                };
                Ok((tx, verdict))
            })
            .await;
        match run {
            Ok(RunOutcome::Executed(Handled::Gap { current })) => {
                Attempt::Gap(gap(current, message))
            }
            Ok(RunOutcome::Executed(Handled::Stale { .. })) => Attempt::Done(Consumed::Stale),
            Ok(RunOutcome::Executed(_)) => Attempt::Done(Consumed::Applied),
            Ok(RunOutcome::Replayed(_)) => Attempt::Done(Consumed::Duplicate),
            Err(RunError::InProgress { retry_after }) => Attempt::Busy(retry_after),
            Err(RunError::Mismatch) => Attempt::Poison(MISMATCH.to_string()),
            Err(RunError::NotStarted(error) | RunError::Failed(error)) => {
                Attempt::Failed(error.to_string())
            }
            Err(RunError::LostLease) => Attempt::Busy(self.parts.options.first_backoff),
            Err(RunError::Store(error)) => match error {
                // The handler's own writes refused at commit: the message's fault.
                StoreError::Rejected { .. } => Attempt::Failed(error.to_string()),
                other => Attempt::Unavailable(other),
            },
            Err(other) => Attempt::Unavailable(StoreError::backend(
                "consumer",
                idem_core::Operation::Claim,
                other.to_string(),
            )),
        }
    }

    /// After `message` applied (or parked as a gap): releases its
    /// aggregate ([`release`](Self::release)); a failure is logged, and
    /// left to the next release of the aggregate or to the sweep
    /// ([`ConsumerOptions::release_interval`]).
    async fn release_behind(&self, message: &InboundMessage) {
        let (Some(aggregate), Some(_)) = (message.aggregate(), message.version()) else {
            return;
        };
        if let Err(error) = self.release(aggregate).await {
            tracing::warn!(%error, "could not release what waits behind an event");
        }
    }

    /// Replays `aggregate`'s parked messages in version order while they
    /// apply (or turn out stale or applied before), listing them again
    /// until none is left or one does not apply (a gap still, or a
    /// failure): what an applied event does for the later versions parked
    /// behind it, and what a parked gap does for itself, so that a gap
    /// parked while its predecessor was being applied and released is
    /// never missed by both. A parked message that another delivery or
    /// replay holds is waited for (it may have read the aggregate before
    /// the version this release follows), up to twice the inbox lease.
    /// Answers how many it replayed.
    ///
    /// Run by the consumer after each applied event and parked gap, and
    /// for every aggregate whose oldest parked version is a gap by
    /// [`run`](Self::run)'s sweep; call it to release an aggregate whose
    /// missing version you applied by hand.
    ///
    /// # Errors
    ///
    /// The parking store's or the inbox's failure (what is left stays
    /// parked, for the next release).
    pub async fn release(&self, aggregate: &str) -> Result<usize, ConsumerError> {
        let mut replayed = 0;
        loop {
            let query = ParkedQuery::new(self.parts.name.clone())
                .of_aggregate(aggregate)
                .limit(self.parts.options.release_batch);
            let waiting = self.parts.parking.parked(&query).await?;
            let before = replayed;
            for entry in &waiting {
                match self.replay_waiting(entry).await? {
                    // Resolved meanwhile by another release: on to the next.
                    None => {}
                    Some(Consumed::Applied | Consumed::Stale | Consumed::Duplicate) => {
                        replayed += 1;
                    }
                    Some(_) => return Ok(replayed),
                }
            }
            // Every one replayed: more may wait (past the listing's limit,
            // or parked since). None (or none left): done.
            if replayed == before {
                return Ok(replayed);
            }
        }
    }

    /// Replays a parked message, waiting out whoever holds its inbox
    /// claim (with a doubling pause, up to twice the inbox lease).
    async fn replay_waiting(
        &self,
        entry: &ParkedMessage,
    ) -> Result<Option<Consumed>, ConsumerError> {
        let patience = tokio::time::Instant::now() + self.parts.options.lease.saturating_mul(2);
        let mut pause = Duration::from_millis(10);
        loop {
            let consumed = self.replay_entry(entry).await?;
            let Some(Consumed::InProgress { after }) = consumed else {
                return Ok(consumed);
            };
            let now = tokio::time::Instant::now();
            if now >= patience {
                return Ok(Some(Consumed::InProgress { after }));
            }
            tokio::time::sleep(pause.min(after).min(patience - now)).await;
            pause = pause.saturating_mul(2).min(Duration::from_secs(1));
        }
    }

    /// The aggregates whose oldest parked version is a version gap, found
    /// among this consumer's `limit` oldest parked messages (one listing,
    /// then one per aggregate found): each waits for a version that no
    /// parked message holds. Most are released as soon as that version
    /// applies; one still listed after a sweep
    /// ([`ConsumerOptions::release_interval`]) waits for a message that
    /// never came, or that a consumer could not apply. An operator applies
    /// or publishes it again, then [`release`](Self::release)s the
    /// aggregate, or drops ([`drop_parked`](Self::drop_parked)) what waits.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn stuck(&self, limit: usize) -> Result<Vec<Stuck>, StoreError> {
        Stuck::find(&*self.parts.parking, &self.parts.name, limit).await
    }

    /// One sweep: releases every stuck aggregate, and records how many
    /// stay stuck ([`STUCK`](crate::STUCK)).
    async fn sweep(&self) -> Result<usize, ConsumerError> {
        let limit = self.parts.options.release_batch;
        for stuck in self.stuck(limit).await? {
            self.release(&stuck.aggregate).await?;
        }
        let left = self.stuck(limit).await?.len();
        crate::record_stuck(&self.parts.name, left);
        Ok(left)
    }

    /// [`run`](Self::run)'s sweeps, in a task of their own, stopped when
    /// the guard drops (a release cut off leaves its message parked, for
    /// the next).
    fn sweeper(&self) -> AbortOnDrop
    where
        H: Handler,
    {
        let consumer = self.clone();
        let interval = self.parts.options.release_interval;
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if let Err(error) = consumer.sweep().await {
                    tracing::warn!(%error, "could not sweep the stuck aggregates");
                }
            }
        }))
    }

    /// This consumer's parked messages, oldest first (of one aggregate by
    /// version, if given).
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn parked(
        &self,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ParkedMessage>, StoreError> {
        let mut query = ParkedQuery::new(self.parts.name.clone()).limit(limit);
        query.aggregate = aggregate.map(str::to_string);
        self.parts.parking.parked(&query).await
    }

    /// Replays a parked message through the handler, as a delivery would:
    /// applied (or found stale or applied before), it is resolved
    /// replayed; failing, it stays parked with the new reason. `None` when
    /// no such message is parked.
    ///
    /// # Errors
    ///
    /// A store failure (the message stays parked).
    pub async fn replay(&self, id: &IdempotencyKey) -> Result<Option<Consumed>, ConsumerError> {
        let Some(entry) = self.parts.parking.get(&self.parts.name, id).await? else {
            return Ok(None);
        };
        let consumed = self.replay_entry(&entry).await?;
        if consumed == Some(Consumed::Applied) {
            self.release_behind(&entry.parked.message).await;
        }
        Ok(consumed)
    }

    async fn replay_entry(&self, entry: &ParkedMessage) -> Result<Option<Consumed>, ConsumerError> {
        if entry.state != idem_core::store::ParkedState::Parked {
            return Ok(None);
        }
        let message = &entry.parked.message;
        let consumed = match self.attempt(message).await {
            Attempt::Done(consumed) => {
                self.parts
                    .parking
                    .resolve(
                        &Scope::new(self.parts.name.clone(), message.id().clone()),
                        &Resolution::Replayed,
                    )
                    .await?;
                consumed
            }
            Attempt::Busy(after) => Consumed::InProgress { after },
            Attempt::Unavailable(error) => return Err(error.into()),
            Attempt::Failed(reason) | Attempt::Gap(reason) | Attempt::Poison(reason) => {
                let deliveries = entry.parked.deliveries.saturating_add(1);
                self.park(message, &reason, deliveries).await?;
                Consumed::Parked { reason }
            }
        };
        Ok(Some(consumed))
    }

    /// Drops a parked message with `reason` (kept); whether it was parked.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn drop_parked(&self, id: &IdempotencyKey, reason: &str) -> Result<bool, StoreError> {
        let dropped = Resolution::Dropped(reason.to_string());
        self.parts
            .parking
            .resolve(&Scope::new(self.parts.name.clone(), id.clone()), &dropped)
            .await
    }
}
