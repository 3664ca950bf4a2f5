//! What the console answers, whichever way in (the JSON API, the page, the
//! command line): pages of a listing, the outcome of an action, payloads.

use base64::Engine as _;
use idem_core::InvalidInput;
use idem_core::store::MAX_OUTBOX_BATCH;
use serde::{Deserialize, Serialize};

/// What a page must be.
pub(crate) const PAGE_RULE: &str = "a page holds 1 item or more, within a listing's first 1000";

/// A page of a listing: `limit` items from `offset` (oldest first).
/// Listings reach the first [`MAX_OUTBOX_BATCH`] items (1,000): past them,
/// mend the first ones.
///
/// ```
/// use idem_admin::Page;
///
/// let page = Page::new(50, 50)?;
/// assert_eq!(page.offset(), 50);
/// assert!(Page::new(990, 50).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PageQuery")]
pub struct Page {
    offset: usize,
    limit: usize,
}

/// A page as a query string gives it, before it is checked.
#[derive(Deserialize)]
struct PageQuery {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    Page::DEFAULT_LIMIT
}

impl TryFrom<PageQuery> for Page {
    type Error = InvalidInput;

    fn try_from(query: PageQuery) -> Result<Self, InvalidInput> {
        Self::new(query.offset, query.limit)
    }
}

impl Default for Page {
    fn default() -> Self {
        Self {
            offset: 0,
            limit: Self::DEFAULT_LIMIT,
        }
    }
}

impl Page {
    /// Items a page holds unless asked otherwise.
    pub const DEFAULT_LIMIT: usize = 50;

    /// `limit` items (1 or more) from `offset`, within the first
    /// [`MAX_OUTBOX_BATCH`].
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] otherwise.
    pub fn new(offset: usize, limit: usize) -> Result<Self, InvalidInput> {
        if limit == 0 || offset.saturating_add(limit) > MAX_OUTBOX_BATCH {
            return Err(InvalidInput::OutOfRange {
                field: "page",
                reason: PAGE_RULE,
            });
        }
        Ok(Self { offset, limit })
    }

    /// Where it starts.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// How many items it holds at most.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How many items from the start a store lists to fill it.
    pub(crate) fn reach(&self) -> usize {
        self.offset + self.limit
    }

    /// The page of `listed` (the first [`reach`](Self::reach) items) out of
    /// `total`.
    pub(crate) fn of<T>(&self, listed: Vec<T>, total: u64) -> Listing<T> {
        let items: Vec<T> = listed
            .into_iter()
            .skip(self.offset)
            .take(self.limit)
            .collect();
        let more = (self.reach() as u64) < total && self.reach() < MAX_OUTBOX_BATCH;
        Listing {
            items,
            offset: self.offset,
            limit: self.limit,
            total,
            next_offset: more.then_some(self.reach()),
        }
    }
}

/// A page of a listing, with the whole listing's count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Listing<T> {
    /// The items, oldest first.
    pub items: Vec<T>,
    /// Where the page starts.
    pub offset: usize,
    /// How many it holds at most.
    pub limit: usize,
    /// How many there are in all.
    pub total: u64,
    /// Where the next page starts, if there is one within reach.
    pub next_offset: Option<usize>,
}

/// What an operator can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub enum Action {
    /// Read a record (traced: keys can be personal data).
    #[serde(rename = "record.read")]
    RecordRead,
    /// Delete a record.
    #[serde(rename = "record.delete")]
    RecordDelete,
    /// Make a parked outbox message pending again.
    #[serde(rename = "outbox.retry")]
    OutboxRetry,
    /// Drop an outbox message, with a reason.
    #[serde(rename = "outbox.drop")]
    OutboxDrop,
    /// Run a consumer's parked message through its handler again.
    #[serde(rename = "consumer.replay")]
    ConsumerReplay,
    /// Drop a consumer's parked message, with a reason.
    #[serde(rename = "consumer.drop")]
    ConsumerDrop,
    /// Settle a journal operation with the provider's answer.
    #[serde(rename = "journal.settle")]
    JournalSettle,
}

impl Action {
    /// Every action.
    pub const ALL: [Self; 7] = [
        Self::RecordRead,
        Self::RecordDelete,
        Self::OutboxRetry,
        Self::OutboxDrop,
        Self::ConsumerReplay,
        Self::ConsumerDrop,
        Self::JournalSettle,
    ];

    /// Its name, as traces, the JSON API and the page's forms carry it.
    ///
    /// ```
    /// use idem_admin::Action;
    ///
    /// assert_eq!(Action::OutboxDrop.as_str(), "outbox.drop");
    /// assert_eq!(Action::parse("outbox.drop"), Some(Action::OutboxDrop));
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RecordRead => "record.read",
            Self::RecordDelete => "record.delete",
            Self::OutboxRetry => "outbox.retry",
            Self::OutboxDrop => "outbox.drop",
            Self::ConsumerReplay => "consumer.replay",
            Self::ConsumerDrop => "consumer.drop",
            Self::JournalSettle => "journal.settle",
        }
    }

    /// The action named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.as_str() == name)
    }

    /// Whether it cannot be undone, and so is confirmed first on the page.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::RecordDelete | Self::OutboxDrop | Self::ConsumerDrop | Self::JournalSettle
        )
    }
}

/// What an action did. Repeated, an action answers what the first one
/// left (`changed: false`), never an error that would hide it.
///
/// ```
/// use idem_admin::{Action, Done};
///
/// let done = Done::new(Action::OutboxRetry, false, "waiting", None);
/// assert_eq!(serde_json::to_value(&done)?["action"], "outbox.retry");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Done {
    /// The action.
    pub action: Action,
    /// Whether this call changed anything (`false`: it was done before, or
    /// there was nothing to do).
    pub changed: bool,
    /// The item's state now (`pending`, `dropped`, `replayed`, `parked`,
    /// `succeeded`, `deleted`, `absent`...).
    pub state: String,
    /// The reason kept with it, or what the action found.
    pub detail: Option<String>,
}

impl Done {
    /// `action`'s outcome.
    pub fn new(
        action: Action,
        changed: bool,
        state: impl Into<String>,
        detail: Option<String>,
    ) -> Self {
        Self {
            action,
            changed,
            state: state.into(),
            detail,
        }
    }
}

/// A payload or a body: text where it is UTF-8, standard base64 otherwise.
///
/// ```
/// use idem_admin::Payload;
///
/// assert_eq!(Payload::of(b"{\"total\":5}").data, "{\"total\":5}");
/// assert_eq!(Payload::of(&[0xff, 0x00]).encoding, "base64");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Payload {
    /// `utf-8` or `base64`.
    pub encoding: &'static str,
    /// The bytes so encoded.
    pub data: String,
    /// How many bytes.
    pub bytes: usize,
}

impl Payload {
    /// `bytes` as text or base64.
    pub fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                encoding: "utf-8",
                data: text.to_string(),
                bytes: bytes.len(),
            },
            Err(_) => Self {
                encoding: "base64",
                data: base64::engine::general_purpose::STANDARD.encode(bytes),
                bytes: bytes.len(),
            },
        }
    }
}

/// A duration as whole milliseconds, for JSON.
pub(crate) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
