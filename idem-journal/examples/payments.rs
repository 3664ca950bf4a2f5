//! A checkout that charges cards through a flaky payment provider, and how
//! each charge converged to exactly one effect.
//!
//! Run with `cargo run -p idem-journal --example payments`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_journal::{
    Journal, JournalRecord, Match, OperationId, OperationState, Provider, ProviderOutcome,
    async_trait,
};
use idem_memory::MemoryJournal;

/// What the provider does to the first send of an order.
#[derive(Clone, Copy)]
enum Behaviour {
    Charges,
    LosesTheAnswer,
    StillProcessing,
    Declines,
    RateLimits,
}

/// A payment provider with an idempotency layer of its own (a key's first
/// result is replayed), and faults.
#[derive(Default)]
struct FlakyPayments {
    behaviour: HashMap<String, Behaviour>,
    results: Mutex<HashMap<String, ProviderOutcome>>,
    charges: Mutex<Vec<(String, String)>>,
    polls: Mutex<HashMap<String, u32>>,
}

impl FlakyPayments {
    fn charge(&self, order: &str) -> String {
        let mut charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        let id = format!("ch_{}", charges.len() + 1);
        charges.push((id.clone(), order.to_string()));
        id
    }
}

#[async_trait]
impl Provider for FlakyPayments {
    async fn send(&self, operation: &JournalRecord) -> ProviderOutcome {
        let (key, request) = (operation.provider_key(), operation.request());
        if let Some(first) = self
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return first.clone();
        }
        let order = request["order"].as_str().unwrap_or_default();
        let behaviour = self
            .behaviour
            .get(order)
            .copied()
            .unwrap_or(Behaviour::Charges);
        let (kept, answered) = match behaviour {
            Behaviour::RateLimits => {
                // Nothing happened: no result to keep for the key.
                let mut seen = self.polls.lock().unwrap_or_else(|e| e.into_inner());
                if seen.insert(order.to_string(), 1).is_none() {
                    return ProviderOutcome::NotExecuted {
                        reason: "429 too many requests".into(),
                    };
                }
                let id = self.charge(order);
                let done = ProviderOutcome::Succeeded {
                    provider_id: id,
                    status: "succeeded".into(),
                };
                (done.clone(), done)
            }
            Behaviour::Declines => {
                let done = ProviderOutcome::Failed {
                    provider_id: None,
                    reason: "card declined".into(),
                };
                (done.clone(), done)
            }
            Behaviour::StillProcessing => {
                let id = self.charge(order);
                let pending = ProviderOutcome::Ambiguous {
                    provider_id: Some(id),
                    reason: "processing".into(),
                };
                (pending.clone(), pending)
            }
            Behaviour::LosesTheAnswer => {
                let id = self.charge(order);
                let done = ProviderOutcome::Succeeded {
                    provider_id: id,
                    status: "succeeded".into(),
                };
                let lost = ProviderOutcome::Ambiguous {
                    provider_id: None,
                    reason: "timed out".into(),
                };
                (done, lost)
            }
            Behaviour::Charges => {
                let id = self.charge(order);
                let done = ProviderOutcome::Succeeded {
                    provider_id: id,
                    status: "succeeded".into(),
                };
                (done.clone(), done)
            }
        };
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), kept);
        answered
    }

    async fn retrieve(&self, provider_id: &str) -> ProviderOutcome {
        ProviderOutcome::Succeeded {
            provider_id: provider_id.to_string(),
            status: "succeeded".into(),
        }
    }

    async fn find(&self, operation: &JournalRecord) -> Result<Vec<Match>, String> {
        let charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        Ok(charges
            .iter()
            .filter(|(_, order)| order == operation.id().subject())
            .map(|(id, _)| {
                let outcome = ProviderOutcome::Succeeded {
                    provider_id: id.clone(),
                    status: "succeeded".into(),
                };
                Match::new(id.clone(), outcome)
            })
            .collect())
    }
}

fn describe(op: &JournalRecord) -> String {
    let state = match op.state() {
        OperationState::Succeeded => "succeeded",
        OperationState::Failed => "failed",
        OperationState::Unknown => "unknown",
        OperationState::Pending => "pending",
        _ => "needs review",
    };
    let id = op
        .parts()
        .provider_id
        .as_deref()
        .map(|id| format!(" {id}"))
        .unwrap_or_default();
    let detail = op.parts().detail.as_deref().unwrap_or_default();
    format!("{state}{id} ({detail})")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let orders = [
        ("order-1", Behaviour::Charges),
        ("order-2", Behaviour::LosesTheAnswer),
        ("order-3", Behaviour::StillProcessing),
        ("order-4", Behaviour::Declines),
        ("order-5", Behaviour::RateLimits),
    ];
    let provider = FlakyPayments {
        behaviour: orders.iter().map(|(o, b)| (o.to_string(), *b)).collect(),
        ..FlakyPayments::default()
    };
    let journal = Journal::new(Arc::new(MemoryJournal::new()), "checkout")?;
    for (order, _) in orders {
        let id = OperationId::new(order, "charge")?;
        // Recorded before the side effect, with the key derived from it.
        journal
            .record(&id, serde_json::json!({"order": order, "amount": 5990}))
            .await?;
        let mut steps = Vec::new();
        let mut op = journal.execute(&id, &provider).await?;
        steps.push(describe(&op));
        // The caller retries what is not settled; a reconciler would too.
        while !op.state().is_settled() && steps.len() < 5 {
            op = journal.execute(&id, &provider).await?;
            steps.push(describe(&op));
        }
        println!(
            "{order} charge: {}  [{} send(s)]",
            steps.join(" -> "),
            op.parts().sends
        );
    }
    let charges = provider
        .charges
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len();
    println!("charges at the provider: {charges} (one per order that went through)");
    Ok(())
}
