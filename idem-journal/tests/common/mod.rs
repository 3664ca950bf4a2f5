//! A fake payment provider that behaves like a real idempotency layer: the
//! first result per key is replayed, keys are pruned after the window, and
//! its search lags behind; and the faults a real one shows, by script.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::ManualClock;
use idem_core::store::{Clock, SystemClock, Timestamp};
use idem_journal::{Delivery, JournalRecord, Match, Provider, ProviderOutcome, async_trait};
use tokio::sync::Notify;

/// The passing of time in a test: a manual clock moved at once (memory), or
/// real time waited out (stores whose server's clock judges).
#[derive(Clone)]
pub enum Time {
    /// Moved by hand; the store and the provider read it.
    Manual(ManualClock),
    /// The system's: sleeping lets it pass.
    Real,
}

impl Time {
    /// A manual clock from a start of its own.
    pub fn manual() -> Self {
        Self::Manual(ManualClock::new(Timestamp::from_unix_millis(
            1_800_000_000_000,
        )))
    }

    /// Lets `by` pass (at least: real time may run further).
    pub async fn pass(&self, by: Duration) {
        match self {
            Self::Manual(clock) => clock.advance(by),
            Self::Real => tokio::time::sleep(by).await,
        }
    }

    /// The clock the provider reads.
    pub fn clock(&self) -> Arc<dyn Clock> {
        match self {
            Self::Manual(clock) => Arc::new(clock.clone()),
            Self::Real => Arc::new(SystemClock),
        }
    }
}

/// What the next send does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Charges, and the answer is lost (a timeout).
    LoseResponse,
    /// Does not charge: rate limited.
    RateLimit,
    /// Charges, still processing: the answer has the id and no final status.
    Processing,
    /// Declines.
    Decline,
    /// Never answers before charging (the caller crashes meanwhile).
    HangBeforeCharge,
    /// Charges, then never answers (the caller crashes meanwhile).
    HangAfterCharge,
}

/// One effect at the provider: a charge, with the metadata the request
/// carried (the operation's namespace and id) and the key it came with.
#[derive(Debug, Clone)]
pub struct Charge {
    pub id: String,
    pub operation: String,
    pub key: String,
    pub status: &'static str,
    pub at: Timestamp,
}

#[derive(Default)]
struct State {
    charges: Vec<Charge>,
    /// Key -> the first result, when the key was first seen, and the
    /// request it came with.
    keys: HashMap<String, (ProviderOutcome, Timestamp, serde_json::Value)>,
    faults: VecDeque<Fault>,
    sends: usize,
    /// Retrieves of a processing charge before it settles.
    processing_polls: usize,
}

#[derive(Clone)]
pub struct FakeProvider {
    state: Arc<Mutex<State>>,
    pub clock: Arc<dyn Clock>,
    /// How long it keeps keys.
    pub window: Duration,
    /// How far behind its search runs.
    pub search_lag: Duration,
    /// What the journal is told of its delivery (keyed by default, an hour
    /// less than `window`).
    pub delivery: Option<Delivery>,
    /// Wakes nothing: a hung call waits on it forever.
    never: Arc<Notify>,
}

impl FakeProvider {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Arc::default(),
            clock,
            window: Duration::from_secs(24 * 3600),
            search_lag: Duration::from_secs(5),
            delivery: None,
            never: Arc::new(Notify::new()),
        }
    }

    pub fn then(&self, fault: Fault) -> &Self {
        self.state.lock().unwrap().faults.push_back(fault);
        self
    }

    /// External effects so far.
    pub fn charges(&self) -> Vec<Charge> {
        self.state.lock().unwrap().charges.clone()
    }

    pub fn sends(&self) -> usize {
        self.state.lock().unwrap().sends
    }

    /// A charge made outside the journal's knowledge (a duplicate by hand,
    /// with no key).
    pub fn charge_by_hand(&self, operation: &JournalRecord) {
        let mut state = self.state.lock().unwrap();
        let at = self.clock.now();
        Self::charge(
            &mut state,
            &operation.key().to_string(),
            "",
            "succeeded",
            at,
        );
    }

    fn charge(
        state: &mut State,
        operation: &str,
        key: &str,
        status: &'static str,
        at: Timestamp,
    ) -> String {
        let id = format!("ch_{}", state.charges.len() + 1);
        state.charges.push(Charge {
            id: id.clone(),
            operation: operation.to_string(),
            key: key.to_string(),
            status,
            at,
        });
        id
    }
}

#[async_trait]
impl Provider for FakeProvider {
    async fn send(&self, record: &JournalRecord) -> ProviderOutcome {
        let now = self.clock.now();
        let (key, request) = (record.provider_key(), record.request());
        let operation = record.key().to_string();
        let hang = {
            let mut state = self.state.lock().unwrap();
            state.sends += 1;
            // Keys older than the window are forgotten.
            let window = self.window;
            state.keys.retain(|_, (_, seen, _)| now < *seen + window);
            if let Some((first, _, first_request)) = state.keys.get(key) {
                if first_request != request {
                    return ProviderOutcome::KeyReused {
                        reason: "400: keys can only be used with the same parameters".into(),
                    };
                }
                return first.clone();
            }
            let fault = state.faults.pop_front();
            let outcome = match fault {
                Some(Fault::RateLimit) => {
                    return ProviderOutcome::NotExecuted {
                        reason: "429 rate limited".into(),
                    };
                }
                Some(Fault::HangBeforeCharge) => None,
                Some(Fault::Decline) => Some(ProviderOutcome::Failed {
                    provider_id: None,
                    reason: "card declined".into(),
                }),
                Some(Fault::Processing) => {
                    let id = Self::charge(&mut state, &operation, key, "processing", now);
                    state.processing_polls = 1;
                    Some(ProviderOutcome::Ambiguous {
                        provider_id: Some(id),
                        reason: "processing".into(),
                    })
                }
                _ => {
                    let id = Self::charge(&mut state, &operation, key, "succeeded", now);
                    Some(ProviderOutcome::Succeeded {
                        provider_id: id,
                        status: "succeeded".into(),
                    })
                }
            };
            match (fault, outcome) {
                (_, None) => true,
                (Some(Fault::LoseResponse), Some(outcome)) => {
                    state
                        .keys
                        .insert(key.to_string(), (outcome, now, request.clone()));
                    return ProviderOutcome::Ambiguous {
                        provider_id: None,
                        reason: "timed out".into(),
                    };
                }
                (Some(Fault::HangAfterCharge), Some(outcome)) => {
                    state
                        .keys
                        .insert(key.to_string(), (outcome, now, request.clone()));
                    true
                }
                (_, Some(outcome)) => {
                    state
                        .keys
                        .insert(key.to_string(), (outcome.clone(), now, request.clone()));
                    return outcome;
                }
            }
        };
        if hang {
            self.never.notified().await;
        }
        ProviderOutcome::Ambiguous {
            provider_id: None,
            reason: "unreachable".into(),
        }
    }

    async fn retrieve(&self, provider_id: &str) -> ProviderOutcome {
        let mut state = self.state.lock().unwrap();
        if state.processing_polls > 0 {
            state.processing_polls -= 1;
            return ProviderOutcome::Ambiguous {
                provider_id: Some(provider_id.to_string()),
                reason: "processing".into(),
            };
        }
        match state.charges.iter_mut().find(|c| c.id == provider_id) {
            Some(charge) => {
                charge.status = "succeeded";
                ProviderOutcome::Succeeded {
                    provider_id: charge.id.clone(),
                    status: "succeeded".into(),
                }
            }
            None => ProviderOutcome::Ambiguous {
                provider_id: Some(provider_id.to_string()),
                reason: "not found yet".into(),
            },
        }
    }

    async fn find(&self, record: &JournalRecord) -> Result<Vec<Match>, String> {
        let now = self.clock.now();
        let state = self.state.lock().unwrap();
        let operation = record.key().to_string();
        Ok(state
            .charges
            .iter()
            .filter(|c| c.operation == operation && c.at + self.search_lag <= now)
            .map(|c| {
                let found = Match::new(
                    c.id.clone(),
                    ProviderOutcome::Succeeded {
                        provider_id: c.id.clone(),
                        status: c.status.to_string(),
                    },
                );
                if c.key.is_empty() {
                    found
                } else {
                    found.with_provider_key(c.key.clone())
                }
            })
            .collect())
    }

    fn delivery(&self) -> Delivery {
        // The journal stops resending a margin before the provider forgets.
        self.delivery.unwrap_or_else(|| {
            let keys = idem_journal::KeyWindow::new(self.window, self.window / 24);
            Delivery::Keyed(keys.expect("a margin of a 24th of the window"))
        })
    }
}
