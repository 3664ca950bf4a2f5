//! `idem`: the operator's console on a terminal, for a person with no
//! admin route deployed. It connects to a store by URL and does what the
//! console's JSON API does, printing tables (or JSON with `--json`).
//!
//! ```text
//! idem --store postgres://localhost/app records get acme pay-1
//! idem --store postgres://localhost/app outbox parked
//! idem --store postgres://localhost/app outbox drop 1b4e… --reason "refunded by hand"
//! idem --store redis://127.0.0.1:6379 journal list billing
//! idem --store 'dynamodb://idem-parked?region=eu-west-1' consumer parked shipping
//! idem --store postgres://localhost/app consumer stuck shipping
//! ```
//!
//! Exit codes: 0 done (a repeat that changed nothing included), 1 a store
//! failure, 2 a usage error (bad arguments, a bad URL, a part the store
//! does not keep), 3 not found, 4 a conflict (the item is in another
//! state, or held: try again), 5 not possible here (a consumer's replay
//! runs its handler, which only the service has: use its admin route),
//! 6 the store did not answer (try again).
//!
//! Every action is traced to standard error with the operator
//! (`--operator`, `IDEM_OPERATOR`, or `USER`) and the key's hash.
//!
//! Every backend is built in by default (`cargo install idem-cli`); one
//! feature per backend (`postgres`, `redis`, `dynamodb`) builds only what
//! is used: `cargo install idem-cli --no-default-features --features
//! postgres` leaves out Redis and the AWS SDK. A URL of a backend left out
//! is a usage error that says which feature to build with.

#[cfg(not(any(feature = "postgres", feature = "redis", feature = "dynamodb")))]
compile_error!(
    "idem-cli needs a backend: build it with at least one of the features postgres, redis, dynamodb"
);

mod connect;
mod print;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem_admin::{Admin, AdminError, Operator, Outcome, Page, RecordRef, Settlement};

use crate::connect::{ConnectError, Part};
use crate::print::{done, fields, listing, print};

/// See and mend what is stuck in an idem store.
#[derive(Parser)]
#[command(name = "idem", version, about)]
struct Cli {
    /// The store: postgres://…, redis://…, dynamodb://TABLE?endpoint=…&region=…
    #[arg(long, env = "IDEM_STORE_URL", global = true)]
    store: Option<String>,
    /// The part's table (Postgres) or key prefix (Redis), where not the default.
    #[arg(long, global = true)]
    table: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Who acts, for the trace (default: IDEM_OPERATOR, else USER).
    #[arg(long, global = true)]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Idempotency records.
    #[command(subcommand)]
    Records(Records),
    /// The transactional outbox.
    #[command(subcommand)]
    Outbox(Outbox),
    /// A consumer's parked messages.
    #[command(subcommand)]
    Consumer(Consumers),
    /// A journal's operations needing a person.
    #[command(subcommand)]
    Journal(Journals),
}

#[derive(Subcommand)]
enum Records {
    /// Shows the record of a key.
    Get {
        /// The tenant the key belongs to (the HTTP layer's `default` unless
        /// the service names tenants).
        tenant: String,
        /// The idempotency key, as the client sent it.
        key: String,
    },
    /// Deletes the record of a key: its next request runs again.
    Delete {
        /// The tenant the key belongs to.
        tenant: String,
        /// The idempotency key, as the client sent it.
        key: String,
    },
}

#[derive(Subcommand)]
enum Outbox {
    /// The backlog: pending, parked, the oldest pending message's age.
    Stats,
    /// Parked messages, oldest first.
    Parked {
        /// How many of the oldest to skip.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// How many to show.
        #[arg(long, default_value_t = Page::DEFAULT_LIMIT)]
        limit: usize,
    },
    /// One message, in any state.
    Show {
        /// The message's id (a UUID).
        id: String,
    },
    /// Makes a parked message pending again, in its place.
    Retry {
        /// The message's id (a UUID).
        id: String,
    },
    /// Drops a message, so its aggregate flows again.
    Drop {
        /// The message's id (a UUID).
        id: String,
        /// Why, kept with the message.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum Consumers {
    /// A consumer's parked messages, oldest first.
    Parked {
        /// The consumer's name.
        consumer: String,
        /// How many of the oldest to skip.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// How many to show.
        #[arg(long, default_value_t = Page::DEFAULT_LIMIT)]
        limit: usize,
    },
    /// A consumer's aggregates stuck behind a version gap: each waits for
    /// a version that no parked message holds.
    Stuck {
        /// The consumer's name.
        consumer: String,
        /// How many of the oldest to skip.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// How many to show.
        #[arg(long, default_value_t = Page::DEFAULT_LIMIT)]
        limit: usize,
    },
    /// Refused here: a replay runs the consumer's handler, which only the
    /// service has (use its admin route).
    Replay {
        /// The consumer's name.
        consumer: String,
        /// The parked message's id.
        id: String,
    },
    /// Drops a parked message: it is never applied.
    Drop {
        /// The consumer's name.
        consumer: String,
        /// The parked message's id.
        id: String,
        /// Why, kept with the message.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum Journals {
    /// Operations whose outcome is unknown or that need review.
    List {
        /// The journal's namespace.
        namespace: String,
        /// How many to show.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Settles an operation with the provider's answer.
    Settle {
        /// The journal's namespace.
        namespace: String,
        /// The operation's subject (what it is about: an order, an invoice).
        subject: String,
        /// The operation's effect (what it does: charge, refund).
        effect: String,
        /// What the provider says happened.
        #[arg(long, value_parser = ["succeeded", "failed"])]
        outcome: String,
        /// The provider's id of the effect, where it has one.
        #[arg(long)]
        provider_id: Option<String>,
        /// Why the operator settles it so, kept with the operation.
        #[arg(long)]
        note: String,
    },
}

const EXIT_STORE: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_NOT_FOUND: u8 = 3;
const EXIT_CONFLICT: u8 = 4;
const EXIT_NOT_HERE: u8 = 5;
const EXIT_UNAVAILABLE: u8 = 6;

/// Why a command failed, as its exit code and message.
struct Failure(u8, String);

impl From<AdminError> for Failure {
    fn from(error: AdminError) -> Self {
        let code = match &error {
            AdminError::NotFound { .. } => EXIT_NOT_FOUND,
            AdminError::Conflict(_) | AdminError::Busy { .. } => EXIT_CONFLICT,
            AdminError::ReplayNeedsHandler { .. } => EXIT_NOT_HERE,
            AdminError::InvalidInput(_) | AdminError::Absent { .. } => EXIT_USAGE,
            AdminError::Store { source, .. } if source.is_retryable() => EXIT_UNAVAILABLE,
            _ => EXIT_STORE,
        };
        Self(code, error.to_string())
    }
}

impl From<ConnectError> for Failure {
    fn from(error: ConnectError) -> Self {
        let code = match error {
            ConnectError::Usage(_) => EXIT_USAGE,
            ConnectError::Unavailable(_) => EXIT_UNAVAILABLE,
        };
        Self(code, error.to_string())
    }
}

fn operator(given: Option<String>) -> Result<Operator, Failure> {
    let name = given
        .or_else(|| std::env::var("IDEM_OPERATOR").ok())
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".into());
    Operator::new(format!("{name} (idem cli)")).map_err(|e| Failure(EXIT_USAGE, e.to_string()))
}

const OUTBOX_COLUMNS: print::Columns = &[
    "id",
    "aggregate",
    "sequence",
    "kind",
    "attempts",
    "last_error",
];
const PARKED_COLUMNS: print::Columns =
    &["id", "kind", "aggregate", "version", "deliveries", "reason"];
const STUCK_COLUMNS: print::Columns =
    &["aggregate", "at", "waiting_for", "oldest_parked", "parked"];
const JOURNAL_COLUMNS: print::Columns = &[
    "subject",
    "effect",
    "state",
    "detail",
    "provider_key",
    "sends",
];

async fn run(cli: Cli) -> Result<(), Failure> {
    let store = cli.store.clone().ok_or_else(|| {
        Failure(
            EXIT_USAGE,
            "no store: give --store URL or set IDEM_STORE_URL".into(),
        )
    })?;
    let part = match &cli.command {
        Command::Records(_) => Part::Records,
        Command::Outbox(_) => Part::Outbox,
        Command::Consumer(
            Consumers::Parked { consumer, .. }
            | Consumers::Stuck { consumer, .. }
            | Consumers::Replay { consumer, .. }
            | Consumers::Drop { consumer, .. },
        ) => Part::Consumer(consumer.clone()),
        Command::Journal(Journals::List { namespace, .. } | Journals::Settle { namespace, .. }) => {
            Part::Journal(namespace.clone())
        }
    };
    let operator = operator(cli.operator.clone())?;
    let admin: Admin = connect::console(&store, cli.table.as_deref(), &part).await?;
    let json = cli.json;
    let page =
        |offset, limit| Page::new(offset, limit).map_err(|e| Failure(EXIT_USAGE, e.to_string()));
    match cli.command {
        Command::Records(Records::Get { tenant, key }) => {
            let record = admin
                .read_record(&operator, &RecordRef::new(&tenant, &key))
                .await?;
            print(json, &record, fields);
        }
        Command::Records(Records::Delete { tenant, key }) => {
            let outcome = admin
                .delete_record(&operator, &RecordRef::new(&tenant, &key))
                .await?;
            print(json, &outcome, done);
        }
        Command::Outbox(Outbox::Stats) => print(json, &admin.outbox_summary().await?, fields),
        Command::Outbox(Outbox::Parked { offset, limit }) => {
            let parked = admin.outbox_parked(page(offset, limit)?).await?;
            print(json, &parked, |v| listing(v, OUTBOX_COLUMNS));
        }
        Command::Outbox(Outbox::Show { id }) => {
            print(json, &admin.outbox_message(&id).await?, fields)
        }
        Command::Outbox(Outbox::Retry { id }) => {
            print(json, &admin.retry_outbox(&operator, &id).await?, done)
        }
        Command::Outbox(Outbox::Drop { id, reason }) => {
            print(
                json,
                &admin.drop_outbox(&operator, &id, &reason).await?,
                done,
            );
        }
        Command::Consumer(Consumers::Parked {
            consumer,
            offset,
            limit,
        }) => {
            let parked = admin
                .consumer_parked(&consumer, page(offset, limit)?)
                .await?;
            print(json, &parked, |v| listing(v, PARKED_COLUMNS));
        }
        Command::Consumer(Consumers::Stuck {
            consumer,
            offset,
            limit,
        }) => {
            let stuck = admin
                .consumer_stuck(&consumer, page(offset, limit)?)
                .await?;
            print(json, &stuck, |v| listing(v, STUCK_COLUMNS));
        }
        Command::Consumer(Consumers::Replay { consumer, id }) => {
            print(json, &admin.replay(&operator, &consumer, &id).await?, done);
        }
        Command::Consumer(Consumers::Drop {
            consumer,
            id,
            reason,
        }) => {
            print(
                json,
                &admin
                    .drop_parked(&operator, &consumer, &id, &reason)
                    .await?,
                done,
            );
        }
        Command::Journal(Journals::List { namespace, limit }) => {
            let operations = admin.attention(&namespace, limit).await?;
            print(json, &operations, |v| {
                print::table(v.as_array().map_or(&[][..], Vec::as_slice), JOURNAL_COLUMNS)
            });
        }
        Command::Journal(Journals::Settle {
            namespace,
            subject,
            effect,
            outcome,
            provider_id,
            note,
        }) => {
            let outcome = Outcome::parse(&outcome)
                .ok_or_else(|| Failure(EXIT_USAGE, "succeeded or failed".into()))?;
            let settlement =
                Settlement::new(&subject, &effect, outcome, &note).with_provider_id(provider_id);
            print(
                json,
                &admin.settle(&operator, &namespace, &settlement).await?,
                done,
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_STORE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// `idem help` says what each command and each argument is (a user
    /// met bare argument names).
    #[test]
    fn every_command_and_argument_says_what_it_is() {
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                assert!(arg.get_help().is_some(), "{path} <{}>", arg.get_id());
            }
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                assert!(sub.get_about().is_some(), "{path}");
                check(sub, &path);
            }
        }
        let cli = Cli::command();
        cli.clone().debug_assert();
        check(&cli, "idem");
    }
}
