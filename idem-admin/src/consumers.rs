//! A consumer's parked messages: listed and counted from its parking
//! store, replayed through the consumer itself (its handler runs), dropped
//! with a reason.

use std::fmt;
use std::sync::Arc;

use idem_consumer::{Consumer, ConsumerError, Handler, Settled, Stuck};
use idem_core::store::{
    ParkedMessage, ParkedQuery, ParkedState, ParkingStore, Resolution, Timestamp,
};
use idem_core::{ConsumerName, IdempotencyKey, InvalidInput, StoreError, async_trait};
use serde::Serialize;

use crate::error::AdminError;
use crate::view::{Action, Done, Listing, Page, Payload};

const PART: &str = "parking";

/// The consumer half of a replay: what the console needs of an
/// `idem_consumer::Consumer`, whatever its handler.
#[async_trait]
trait Replayer: Send + Sync + 'static {
    async fn replay(&self, id: &IdempotencyKey) -> Result<Option<Settled>, ConsumerError>;
    async fn drop_parked(&self, id: &IdempotencyKey, reason: &str) -> Result<bool, StoreError>;
}

#[async_trait]
impl<H: Handler> Replayer for Consumer<H> {
    async fn replay(&self, id: &IdempotencyKey) -> Result<Option<Settled>, ConsumerError> {
        Consumer::replay(self, id).await
    }

    async fn drop_parked(&self, id: &IdempotencyKey, reason: &str) -> Result<bool, StoreError> {
        Consumer::drop_parked(self, id, reason).await
    }
}

/// One consumer's parked messages, as a console shows and mends them: its
/// parking store, and the consumer itself where replays should run (a
/// replay runs the consumer's handler, which only the service has).
///
/// ```
/// use std::sync::Arc;
/// use idem_admin::ConsumerParking;
/// use idem_memory::MemoryParking;
///
/// // Listing and dropping only (the command line's case):
/// let parking = ConsumerParking::new("shipping", Arc::new(MemoryParking::new()))?;
/// assert_eq!(parking.name(), "shipping");
/// assert!(!parking.replays());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone)]
pub struct ConsumerParking {
    name: ConsumerName,
    parking: Arc<dyn ParkingStore>,
    consumer: Option<Arc<dyn Replayer>>,
}

impl fmt::Debug for ConsumerParking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerParking")
            .field("name", &self.name)
            .field("parking", &self.parking)
            .field("replays", &self.consumer.is_some())
            .finish()
    }
}

/// A consumer's parked message as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedView {
    /// The consumer.
    pub consumer: String,
    /// The message id (shown to the authorized operator; never logged).
    pub id: String,
    /// Its type.
    pub kind: String,
    /// Its aggregate and version, if it carries them.
    pub aggregate: Option<String>,
    /// The aggregate's version it carries.
    pub version: Option<u64>,
    /// Why it was parked.
    pub reason: String,
    /// How many times it was delivered.
    pub deliveries: u32,
    /// `parked`, `replayed` or `dropped`.
    pub state: &'static str,
    /// When it was (last) parked, Unix milliseconds by the store's clock.
    pub parked_at: Timestamp,
    /// When it was replayed or dropped.
    pub resolved_at: Option<Timestamp>,
    /// The operator's reason to drop it.
    pub resolution: Option<String>,
    /// Its payload.
    pub payload: Payload,
}

/// An aggregate stuck behind a version gap, as an operator sees it: its
/// oldest parked version waits for a version that no parked message holds
/// (`idem_consumer::Consumer::stuck`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StuckView {
    /// The consumer.
    pub consumer: String,
    /// The aggregate.
    pub aggregate: String,
    /// The version it was at when its oldest parked version was parked.
    pub at: u64,
    /// The version its parked messages wait for, which no one holds.
    pub waiting_for: u64,
    /// Its oldest parked version.
    pub oldest_parked: u64,
    /// How many of its messages are parked.
    pub parked: usize,
    /// When its oldest parked version was (last) parked, Unix milliseconds
    /// by the store's clock.
    pub since: Timestamp,
}

impl ParkedView {
    fn of(entry: &ParkedMessage) -> Self {
        let message = &entry.parked.message;
        Self {
            consumer: entry.parked.consumer.as_str().to_string(),
            id: message.id().as_str().to_string(),
            kind: message.kind().to_string(),
            aggregate: message.aggregate().map(str::to_string),
            version: message.version(),
            reason: entry.parked.reason.clone(),
            deliveries: entry.parked.deliveries,
            state: entry.state.as_str(),
            parked_at: entry.parked_at,
            resolved_at: entry.resolved_at,
            resolution: entry.resolution.clone(),
            payload: Payload::of(message.payload()),
        }
    }
}

impl ConsumerParking {
    /// The parked messages of the consumer named `name` in `parking`:
    /// listed and dropped; a replay is refused
    /// ([`AdminError::ReplayNeedsHandler`]), since it runs the consumer's
    /// handler.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad name.
    pub fn new(name: &str, parking: Arc<dyn ParkingStore>) -> Result<Self, InvalidInput> {
        Ok(Self {
            name: ConsumerName::new(name)?,
            parking,
            consumer: None,
        })
    }

    /// The parked messages of `consumer`, kept in `parking` (the store the
    /// consumer parks in): replays go through the consumer
    /// ([`Consumer::replay`]), and drops ([`Consumer::drop_parked`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_admin::ConsumerParking;
    /// use idem_consumer::{Consumer, Handled, Handler, async_trait};
    /// use idem_core::store::InboundMessage;
    /// use idem_core::{HandlerError, StoreError};
    /// use idem_memory::{MemoryParking, MemoryStore, MemoryTransaction};
    ///
    /// /// The service's handler: its writes join the inbox's transaction.
    /// struct Shipping { inbox: MemoryStore }
    ///
    /// #[async_trait]
    /// impl Handler for Shipping {
    ///     type Tx = MemoryTransaction;
    ///     async fn begin(&self) -> Result<MemoryTransaction, StoreError> {
    ///         Ok(self.inbox.begin())
    ///     }
    ///     async fn handle(&self, _: &InboundMessage, tx: MemoryTransaction) -> Result<(MemoryTransaction, Handled), HandlerError> {
    ///         Ok((tx, Handled::Applied))
    ///     }
    /// }
    ///
    /// let (inbox, parking) = (MemoryStore::new(), Arc::new(MemoryParking::new()));
    /// let shipping = Shipping { inbox: inbox.clone() };
    /// let consumer = Consumer::new("shipping", Arc::new(inbox), parking.clone(), shipping)?;
    /// let parked = ConsumerParking::with_consumer(&consumer, parking);
    /// assert!(parked.replays());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn with_consumer<H: Handler>(
        consumer: &Consumer<H>,
        parking: Arc<dyn ParkingStore>,
    ) -> Self {
        Self {
            name: consumer.name().clone(),
            parking,
            consumer: Some(Arc::new(consumer.clone())),
        }
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Whether replays run here (the consumer was given).
    pub fn replays(&self) -> bool {
        self.consumer.is_some()
    }

    pub(crate) async fn count(&self) -> Result<u64, AdminError> {
        self.parking
            .count(&self.name)
            .await
            .map_err(AdminError::store(PART))
    }

    /// The oldest parked entry, if any.
    pub(crate) async fn oldest(&self) -> Result<Option<ParkedView>, AdminError> {
        let query = ParkedQuery::new(self.name.clone()).limit(1);
        let listed = self
            .parking
            .parked(&query)
            .await
            .map_err(AdminError::store(PART))?;
        Ok(listed.first().map(ParkedView::of))
    }

    pub(crate) async fn parked(&self, page: Page) -> Result<Listing<ParkedView>, AdminError> {
        let total = self.count().await?;
        let query = ParkedQuery::new(self.name.clone()).limit(page.reach());
        let listed = self
            .parking
            .parked(&query)
            .await
            .map_err(AdminError::store(PART))?;
        Ok(page.of(listed.iter().map(ParkedView::of).collect(), total))
    }

    /// The aggregates stuck behind a gap among the oldest parked messages
    /// the page reaches.
    pub(crate) async fn stuck(&self, page: Page) -> Result<Listing<StuckView>, AdminError> {
        let found = Stuck::find(&*self.parking, &self.name, page.reach())
            .await
            .map_err(AdminError::store(PART))?;
        let views: Vec<StuckView> = found
            .into_iter()
            .map(|stuck| StuckView {
                consumer: self.name.to_string(),
                aggregate: stuck.aggregate,
                at: stuck.at,
                waiting_for: stuck.waiting_for,
                oldest_parked: stuck.oldest_parked,
                parked: stuck.parked,
                since: stuck.since,
            })
            .collect();
        let total = views.len() as u64;
        Ok(page.of(views, total))
    }

    async fn entry(&self, id: &IdempotencyKey) -> Result<ParkedMessage, AdminError> {
        self.parking
            .get(&self.name, id)
            .await
            .map_err(AdminError::store(PART))?
            .ok_or_else(|| AdminError::NotFound {
                what: format!("parked message of consumer {}", self.name),
            })
    }

    /// Replays a parked message through the consumer; a repeat answers
    /// the replay the first made.
    pub(crate) async fn replay(&self, id: &IdempotencyKey) -> Result<Done, AdminError> {
        let Some(consumer) = &self.consumer else {
            return Err(AdminError::ReplayNeedsHandler {
                consumer: self.name.to_string(),
            });
        };
        let replayed = consumer.replay(id).await.map_err(|error| match error {
            ConsumerError::Store(source) => AdminError::store(PART)(source),
            other => AdminError::Internal {
                part: PART,
                source: other.into(),
            },
        })?;
        match replayed {
            Some(Settled::Parked { reason }) => Ok(Done::new(
                Action::ConsumerReplay,
                true,
                "parked",
                Some(reason),
            )),
            Some(Settled::InProgress { after } | Settled::Retried { after, .. }) => {
                Err(AdminError::Busy {
                    detail: "another delivery of the message is being handled".into(),
                    retry_after: after,
                })
            }
            Some(applied) => Ok(Done::new(
                Action::ConsumerReplay,
                true,
                "replayed",
                Some(applied.as_str().to_string()),
            )),
            None => {
                let entry = self.entry(id).await?;
                match entry.state {
                    ParkedState::Replayed => {
                        Ok(Done::new(Action::ConsumerReplay, false, "replayed", None))
                    }
                    ParkedState::Dropped => Err(AdminError::Conflict(format!(
                        "the message was dropped, not replayed ({})",
                        entry.resolution.unwrap_or_default()
                    ))),
                    _ => Err(AdminError::Conflict(
                        "the message was parked again while it was replayed".into(),
                    )),
                }
            }
        }
    }

    /// Drops a parked message with `reason`; a repeat answers the drop the
    /// first made.
    pub(crate) async fn drop_parked(
        &self,
        id: &IdempotencyKey,
        reason: &str,
    ) -> Result<Done, AdminError> {
        let dropped = match &self.consumer {
            Some(consumer) => consumer.drop_parked(id, reason).await,
            None => {
                let resolution = Resolution::Dropped(reason.to_string());
                self.parking.resolve(&self.name, id, &resolution).await
            }
        }
        .map_err(AdminError::store(PART))?;
        if dropped {
            return Ok(Done::new(
                Action::ConsumerDrop,
                true,
                "dropped",
                Some(reason.to_string()),
            ));
        }
        let entry = self.entry(id).await?;
        match entry.state {
            ParkedState::Dropped => Ok(Done::new(
                Action::ConsumerDrop,
                false,
                "dropped",
                entry.resolution,
            )),
            _ => Err(AdminError::Conflict(
                "the message was replayed: it is not dropped".into(),
            )),
        }
    }
}
