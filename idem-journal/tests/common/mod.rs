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
use idem_core::async_trait;
use idem_core::store::{Clock, Timestamp};
use idem_journal::{Match, OperationId, Provider, ProviderOutcome};
use tokio::sync::Notify;

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

/// One effect at the provider: a charge.
#[derive(Debug, Clone)]
pub struct Charge {
    pub id: String,
    pub operation: String,
    pub status: &'static str,
    pub at: Timestamp,
}

#[derive(Default)]
struct State {
    charges: Vec<Charge>,
    /// Key -> the first result, and when the key was first seen.
    keys: HashMap<String, (ProviderOutcome, Timestamp)>,
    faults: VecDeque<Fault>,
    sends: usize,
    /// Retrieves of a processing charge before it settles.
    processing_polls: usize,
}

#[derive(Clone)]
pub struct FakeProvider {
    state: Arc<Mutex<State>>,
    pub clock: ManualClock,
    pub window: Duration,
    /// How far behind its search runs.
    pub search_lag: Duration,
    /// Wakes nothing: a hung call waits on it forever.
    never: Arc<Notify>,
}

impl FakeProvider {
    pub fn new(clock: ManualClock) -> Self {
        Self {
            state: Arc::default(),
            clock,
            window: Duration::from_secs(24 * 3600),
            search_lag: Duration::from_secs(5),
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

    /// A charge made outside the journal's knowledge (a duplicate by hand).
    pub fn charge_by_hand(&self, operation: &OperationId) {
        let mut state = self.state.lock().unwrap();
        let id = format!("ch_{}", state.charges.len() + 1);
        let at = self.clock.now();
        state.charges.push(Charge {
            id,
            operation: operation.to_string(),
            status: "succeeded",
            at,
        });
    }

    fn charge(state: &mut State, operation: &str, status: &'static str, at: Timestamp) -> String {
        let id = format!("ch_{}", state.charges.len() + 1);
        state.charges.push(Charge {
            id: id.clone(),
            operation: operation.to_string(),
            status,
            at,
        });
        id
    }
}

#[async_trait]
impl Provider for FakeProvider {
    async fn send(&self, key: &str, request: &serde_json::Value) -> ProviderOutcome {
        let now = self.clock.now();
        let operation = request["operation"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let hang = {
            let mut state = self.state.lock().unwrap();
            state.sends += 1;
            // Keys older than the window are forgotten.
            let window = self.window;
            state.keys.retain(|_, (_, seen)| now < *seen + window);
            if let Some((first, _)) = state.keys.get(key) {
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
                    let id = Self::charge(&mut state, &operation, "processing", now);
                    state.processing_polls = 1;
                    Some(ProviderOutcome::Ambiguous {
                        provider_id: Some(id),
                        reason: "processing".into(),
                    })
                }
                _ => {
                    let id = Self::charge(&mut state, &operation, "succeeded", now);
                    Some(ProviderOutcome::Succeeded {
                        provider_id: id,
                        status: "succeeded".into(),
                    })
                }
            };
            match (fault, outcome) {
                (_, None) => true,
                (Some(Fault::LoseResponse), Some(outcome)) => {
                    state.keys.insert(key.to_string(), (outcome, now));
                    return ProviderOutcome::Ambiguous {
                        provider_id: None,
                        reason: "timed out".into(),
                    };
                }
                (Some(Fault::HangAfterCharge), Some(outcome)) => {
                    state.keys.insert(key.to_string(), (outcome, now));
                    true
                }
                (_, Some(outcome)) => {
                    state.keys.insert(key.to_string(), (outcome.clone(), now));
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

    async fn find(&self, operation: &OperationId, _key: &str) -> Result<Vec<Match>, String> {
        let now = self.clock.now();
        let state = self.state.lock().unwrap();
        Ok(state
            .charges
            .iter()
            .filter(|c| c.operation == operation.to_string() && c.at + self.search_lag <= now)
            .map(|c| Match {
                provider_id: c.id.clone(),
                outcome: ProviderOutcome::Succeeded {
                    provider_id: c.id.clone(),
                    status: c.status.to_string(),
                },
            })
            .collect())
    }

    fn key_window(&self) -> Duration {
        // The journal stops resending an hour before the provider forgets.
        self.window - Duration::from_secs(3600)
    }
}
