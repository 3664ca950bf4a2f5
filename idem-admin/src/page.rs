//! The console's page: server-rendered HTML that works without
//! JavaScript. A summary of every part with a chart of the backlog, a list
//! per part with its actions as forms, a confirmation page before anything
//! final (a drop, a delete, a settlement), and a page of what each action
//! did. Every form carries the operator's cross-site request token.

use std::fmt::Write as _;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, OriginalUri, Path, Query, State};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use http::StatusCode;
use http::request::Parts;
use idem_core::store::Record;
use serde::Deserialize;

use crate::admin::{Reading, Summary, record_state};
use crate::error::AdminError;
use crate::html::{Esc, age, ago, bar_chart, until, url_part};
use crate::journal::{Outcome, Settlement};
use crate::records::RecordRef;
use crate::security::Operator;
use crate::shared::Shared;
use crate::view::{Action, Done, Listing, Page};

/// The page's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(summary))
        .route("/outbox", get(outbox))
        .route("/consumers/{name}", get(consumer))
        .route("/journals/{namespace}", get(journal))
        .route("/records", post(record))
        .route("/act", post(act))
}

/// What every page needs: where the console is mounted, who is looking,
/// and the token their forms carry.
struct Ctx {
    prefix: String,
    operator: Operator,
    token: String,
}

impl Ctx {
    /// The link to `path` of the console (`""`: the summary, which a
    /// nested router serves at the prefix itself).
    fn href(&self, path: &str) -> String {
        let link = format!("{}{path}", self.prefix);
        if link.is_empty() { "/".into() } else { link }
    }
}

impl FromRequestParts<Shared> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, shared: &Shared) -> Result<Self, Response> {
        let Some(operator) = parts.extensions.get::<Operator>().cloned() else {
            return Err(StatusCode::FORBIDDEN.into_response());
        };
        // Inside `Router::nest` the path is the nested one; the original
        // path ends with it, after the service's prefix.
        let inner = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(inner, |original| original.path());
        let prefix = original
            .strip_suffix(inner)
            .or_else(|| (inner == "/").then(|| original.trim_end_matches('/')))
            .unwrap_or("")
            .to_string();
        let token = shared.guard.csrf.token(&operator);
        Ok(Self {
            prefix,
            operator,
            token,
        })
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#111827;background:#f9fafb}\
header{background:#111827;color:#f9fafb;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:baseline;flex-wrap:wrap}\
header a{color:#fcd34d;text-decoration:none}header .who{margin-left:auto;font-size:.85rem;color:#d1d5db}\
main{padding:1rem 1.2rem;max-width:80rem}section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:.8rem 1rem;margin:0 0 1rem}\
h1{font-size:1.3rem}h2{font-size:1.1rem;margin:.2rem 0 .6rem}table{border-collapse:collapse;width:100%;font-size:.9rem}\
th,td{border-bottom:1px solid #e5e7eb;padding:.35rem .5rem;text-align:left;vertical-align:top}\
.figures{display:flex;gap:1.5rem;flex-wrap:wrap}.figure b{display:block;font-size:1.6rem}.figure.stuck b{color:#b45309}\
form.inline{display:inline}button{cursor:pointer}.danger{color:#991b1b}.done{border-left:4px solid #059669}\
.failed{border-left:4px solid #b91c1c}pre{white-space:pre-wrap;word-break:break-all;background:#f3f4f6;padding:.4rem;margin:0;max-height:8rem;overflow:auto}\
label{display:block;margin:.4rem 0}textarea,input[type=text]{width:100%;max-width:40rem}";

/// A whole page around `body`.
fn layout(ctx: &Ctx, shared: &Shared, title: &str, body: &str) -> String {
    let p = &ctx.prefix;
    let mut nav = format!("<a href=\"{}\">Summary</a>", ctx.href(""));
    if shared.admin.has_outbox() {
        let _ = write!(nav, "<a href=\"{p}/outbox\">Outbox</a>");
    }
    for name in shared.admin.consumers() {
        let _ = write!(
            nav,
            "<a href=\"{p}/consumers/{}\">Consumer {}</a>",
            url_part(name),
            Esc(name)
        );
    }
    for namespace in shared.admin.journals() {
        let _ = write!(
            nav,
            "<a href=\"{p}/journals/{}\">Journal {}</a>",
            url_part(namespace),
            Esc(namespace)
        );
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
<title>{title} · idem console</title><style>{STYLE}</style></head><body><header><strong>idem console</strong>{nav}\
<span class=\"who\">operator: {who}</span></header><main><h1>{title}</h1>{body}</main></body></html>",
        title = Esc(title),
        who = Esc(ctx.operator.as_str()),
    )
}

/// A form posting `action` with `fields` (hidden) and the token.
fn action_form(ctx: &Ctx, action: Action, fields: &[(&str, &str)], button: &str) -> String {
    let mut form = format!(
        "<form class=\"inline\" method=\"post\" action=\"{}/act\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"{}\">",
        ctx.prefix,
        Esc(&ctx.token),
        action.as_str()
    );
    for (name, value) in fields {
        let _ = write!(
            form,
            "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
            Esc(value)
        );
    }
    let _ = write!(
        form,
        "<button type=\"submit\" name=\"do\" value=\"{}\">{}</button></form>",
        action.as_str(),
        Esc(button)
    );
    form
}

fn figure(label: &str, value: &str, stuck: bool) -> String {
    format!(
        "<div class=\"figure{}\"><b>{}</b>{}</div>",
        if stuck { " stuck" } else { "" },
        Esc(value),
        Esc(label)
    )
}

fn failed(error: &str) -> String {
    format!("<p class=\"failed\">could not be read: {}</p>", Esc(error))
}

fn paging<T>(ctx: &Ctx, path: &str, listing: &Listing<T>) -> String {
    let mut nav = format!(
        "<p class=\"paging\">{} to {} of {}",
        if listing.items.is_empty() {
            0
        } else {
            listing.offset + 1
        },
        listing.offset + listing.items.len(),
        listing.total
    );
    if listing.offset > 0 {
        let previous = listing.offset.saturating_sub(listing.limit);
        let _ = write!(
            nav,
            " · <a href=\"{}{path}?offset={previous}&amp;limit={}\">previous</a>",
            ctx.prefix, listing.limit
        );
    }
    if let Some(next) = listing.next_offset {
        let _ = write!(
            nav,
            " · <a rel=\"next\" href=\"{}{path}?offset={next}&amp;limit={}\">next</a>",
            ctx.prefix, listing.limit
        );
    }
    nav.push_str("</p>");
    nav
}

fn summary_body(ctx: &Ctx, summary: &Summary) -> String {
    let mut body = String::new();
    let mut bars: Vec<(String, u64)> = Vec::new();
    if let Some(outbox) = &summary.outbox {
        body.push_str("<section id=\"outbox\"><h2>Outbox</h2>");
        match outbox {
            Reading::Read(outbox) => {
                let oldest = outbox.oldest_pending_age_ms.map_or("none".into(), age);
                let _ = write!(
                    body,
                    "<div class=\"figures\">{}{}{}</div>",
                    figure("pending", &outbox.pending.to_string(), false),
                    figure("parked", &outbox.parked.to_string(), outbox.parked > 0),
                    figure("oldest pending", &oldest, false),
                );
                if outbox.partitions.is_empty() {
                    bars.push(("outbox pending".into(), outbox.pending));
                } else {
                    body.push_str(
                        "<table><tr><th>partition</th><th>pending</th><th>oldest pending</th></tr>",
                    );
                    for partition in &outbox.partitions {
                        let _ = write!(
                            body,
                            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                            Esc(&partition.partition),
                            partition.pending,
                            partition.oldest_pending_age_ms.map_or("none".into(), age)
                        );
                        bars.push((
                            format!("pending {}", partition.partition),
                            partition.pending,
                        ));
                    }
                    body.push_str("</table>");
                }
                bars.push(("outbox parked".into(), outbox.parked));
                let _ = write!(
                    body,
                    "<p><a href=\"{}/outbox\">parked messages</a></p>",
                    ctx.prefix
                );
            }
            Reading::Failed { error } => body.push_str(&failed(error)),
        }
        body.push_str("</section>");
    }
    for consumer in &summary.consumers {
        let _ = write!(
            body,
            "<section class=\"consumer\"><h2>Consumer {}</h2>",
            Esc(&consumer.name)
        );
        match &consumer.parked {
            Reading::Read(parked) => {
                let oldest = parked
                    .oldest_parked_at
                    .map_or("none".into(), |at| format!("{} ago", ago(at)));
                let _ = write!(
                    body,
                    "<div class=\"figures\">{}{}</div><p><a href=\"{}/consumers/{}\">parked messages</a></p>",
                    figure("parked", &parked.count.to_string(), parked.count > 0),
                    figure("oldest parked", &oldest, false),
                    ctx.prefix,
                    url_part(&consumer.name),
                );
                bars.push((format!("{} parked", consumer.name), parked.count));
            }
            Reading::Failed { error } => body.push_str(&failed(error)),
        }
        body.push_str("</section>");
    }
    for journal in &summary.journals {
        let _ = write!(
            body,
            "<section class=\"journal\"><h2>Journal {}</h2>",
            Esc(&journal.namespace)
        );
        match &journal.attention {
            Reading::Read(figures) => {
                let more = if figures.complete { "" } else { "+" };
                let _ = write!(
                    body,
                    "<div class=\"figures\">{}{}{}</div><p><a href=\"{}/journals/{}\">operations needing a person</a></p>",
                    figure(
                        "unknown outcome",
                        &format!("{}{more}", figures.unknown),
                        figures.unknown > 0
                    ),
                    figure(
                        "needs review",
                        &format!("{}{more}", figures.needs_review),
                        figures.needs_review > 0
                    ),
                    figure(
                        "oldest change",
                        &figures
                            .oldest_change
                            .map_or("none".into(), |at| format!("{} ago", ago(at))),
                        false
                    ),
                    ctx.prefix,
                    url_part(&journal.namespace),
                );
                bars.push((
                    format!("{} unknown", journal.namespace),
                    figures.unknown as u64,
                ));
                bars.push((
                    format!("{} review", journal.namespace),
                    figures.needs_review as u64,
                ));
            }
            Reading::Failed { error } => body.push_str(&failed(error)),
        }
        body.push_str("</section>");
    }
    if summary.records {
        let _ = write!(
            body,
            "<section id=\"records\"><h2>Records</h2><form method=\"post\" action=\"{}/records\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><label>Tenant <input type=\"text\" name=\"tenant\" required></label>\
<label>Idempotency key <input type=\"text\" name=\"key\" required></label><button type=\"submit\">Look up</button></form></section>",
            ctx.prefix,
            Esc(&ctx.token)
        );
    }
    if !bars.is_empty() {
        let chart = bar_chart("Backlog: what waits, part by part", &bars);
        body = format!("<section id=\"backlog\"><h2>Backlog</h2>{chart}</section>{body}");
    }
    body
}

async fn summary(State(shared): State<Shared>, ctx: Ctx) -> Response {
    let summary = shared.admin.summary().await;
    Html(layout(
        &ctx,
        &shared,
        "Summary",
        &summary_body(&ctx, &summary),
    ))
    .into_response()
}

/// A page of `error`, with its status, and a way back.
fn error_page(ctx: &Ctx, shared: &Shared, error: &AdminError, back: &str) -> Response {
    let body = format!(
        "<section class=\"failed\"><p>{}</p><p><a href=\"{}\">back</a></p></section>",
        Esc(&error.detail()),
        ctx.href(back)
    );
    let title = error.status().canonical_reason().unwrap_or("Error");
    (error.status(), Html(layout(ctx, shared, title, &body))).into_response()
}

fn payload_cell(data: &str) -> String {
    let shown: String = data.chars().take(400).collect();
    format!("<pre>{}</pre>", Esc(&shown))
}

/// The page a query asks for, or why it cannot be had.
fn page_of(page: Result<Query<Page>, QueryRejection>) -> Result<Page, AdminError> {
    page.map(|Query(page)| page).map_err(|_| {
        AdminError::InvalidInput(idem_core::InvalidInput::OutOfRange {
            field: "page",
            reason: crate::view::PAGE_RULE,
        })
    })
}

async fn outbox(
    State(shared): State<Shared>,
    ctx: Ctx,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let listed = match page_of(page) {
        Ok(page) => shared.admin.outbox_parked(page).await,
        Err(error) => Err(error),
    };
    let listing = match listed {
        Ok(listing) => listing,
        Err(error) => return error_page(&ctx, &shared, &error, ""),
    };
    let mut body = String::from(
        "<section><table id=\"outbox-parked\"><tr><th>message</th><th>aggregate</th><th>seq</th><th>type</th><th>attempts</th><th>last error</th><th>enqueued</th><th>payload</th><th></th></tr>",
    );
    for message in &listing.items {
        let fields = [("id", message.id.as_str())];
        let _ = write!(
            body,
            "<tr data-id=\"{id}\"><td><code>{id}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ago</td><td>{}</td><td>{}{}</td></tr>",
            Esc(&message.aggregate),
            message.sequence,
            Esc(&message.kind),
            message.attempts,
            Esc(message.last_error.as_deref().unwrap_or("")),
            age(message.age_ms()),
            payload_cell(&message.payload.data),
            action_form(&ctx, Action::OutboxRetry, &fields, "Retry"),
            action_form(&ctx, Action::OutboxDrop, &fields, "Drop…"),
            id = Esc(&message.id),
        );
    }
    body.push_str("</table>");
    body.push_str(&paging(&ctx, "/outbox", &listing));
    body.push_str("</section>");
    Html(layout(&ctx, &shared, "Outbox: parked messages", &body)).into_response()
}

async fn consumer(
    State(shared): State<Shared>,
    ctx: Ctx,
    Path(name): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let listed = match page_of(page) {
        Ok(page) => shared.admin.consumer_parked(&name, page).await,
        Err(error) => Err(error),
    };
    let listing = match listed {
        Ok(listing) => listing,
        Err(error) => return error_page(&ctx, &shared, &error, ""),
    };
    let mut body = String::from(
        "<section><table id=\"consumer-parked\"><tr><th>message</th><th>type</th><th>aggregate</th><th>version</th><th>deliveries</th><th>reason</th><th>parked</th><th>payload</th><th></th></tr>",
    );
    for entry in &listing.items {
        let fields = [("consumer", name.as_str()), ("id", entry.id.as_str())];
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ago</td><td>{}</td><td>{}{}</td></tr>",
            Esc(&entry.id),
            Esc(&entry.kind),
            Esc(entry.aggregate.as_deref().unwrap_or("")),
            entry.version.map_or(String::new(), |v| v.to_string()),
            entry.deliveries,
            Esc(&entry.reason),
            ago(entry.parked_at),
            payload_cell(&entry.payload.data),
            action_form(&ctx, Action::ConsumerReplay, &fields, "Replay"),
            action_form(&ctx, Action::ConsumerDrop, &fields, "Drop…"),
        );
    }
    body.push_str("</table>");
    let path = format!("/consumers/{}", url_part(&name));
    body.push_str(&paging(&ctx, &path, &listing));
    body.push_str("</section>");
    let title = format!("Consumer {name}: parked messages");
    Html(layout(&ctx, &shared, &title, &body)).into_response()
}

async fn journal(
    State(shared): State<Shared>,
    ctx: Ctx,
    Path(namespace): Path<String>,
) -> Response {
    let operations = match shared.admin.attention(&namespace, 200).await {
        Ok(operations) => operations,
        Err(error) => return error_page(&ctx, &shared, &error, ""),
    };
    let mut body = String::from(
        "<section><table id=\"journal-attention\"><tr><th>operation</th><th>state</th><th>detail</th><th>provider key</th><th>sends</th><th>request</th><th>changed</th><th>settle with the provider's answer</th></tr>",
    );
    for op in &operations {
        let _ = write!(
            body,
            "<tr><td>{}/{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{} ago</td><td>\
<form method=\"post\" action=\"{}/act\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"journal.settle\">\
<input type=\"hidden\" name=\"namespace\" value=\"{}\"><input type=\"hidden\" name=\"subject\" value=\"{}\"><input type=\"hidden\" name=\"effect\" value=\"{}\">\
<label>Outcome <select name=\"outcome\"><option value=\"succeeded\">succeeded</option><option value=\"failed\">failed</option></select></label>\
<label>Provider's id <input type=\"text\" name=\"provider_id\"></label><label>Note <input type=\"text\" name=\"note\" required></label>\
<button type=\"submit\">Settle…</button></form></td></tr>",
            Esc(&op.subject),
            Esc(&op.effect),
            op.state.as_str(),
            Esc(op.detail.as_deref().unwrap_or("")),
            Esc(&op.provider_key),
            op.sends,
            payload_cell(&op.request.to_string()),
            ago(op.updated_at),
            ctx.prefix,
            Esc(&ctx.token),
            Esc(&namespace),
            Esc(&op.subject),
            Esc(&op.effect),
        );
    }
    body.push_str("</table></section>");
    let title = format!("Journal {namespace}: operations needing a person");
    Html(layout(&ctx, &shared, &title, &body)).into_response()
}

/// A record lookup: tenant and key in the body, never the URL.
#[derive(Deserialize)]
struct Lookup {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
}

fn forged(ctx: &Ctx, shared: &Shared) -> Response {
    let body = "<section class=\"failed\"><p>This form's token is missing, stale or not yours: \
reload the console and try again.</p></section>";
    (
        StatusCode::FORBIDDEN,
        Html(layout(ctx, shared, "Refused", body)),
    )
        .into_response()
}

fn record_body(ctx: &Ctx, record: &Record) -> String {
    let scope = record.scope();
    let (tenant, key) = (scope.tenant().as_str(), scope.key().as_str());
    let mut body = format!(
        "<section><table id=\"record\"><tr><th>tenant</th><td>{}</td></tr><tr><th>key</th><td><code>{}</code></td></tr>\
<tr><th>state</th><td>{}</td></tr><tr><th>attempt</th><td>{}</td></tr><tr><th>fingerprint</th><td><code>{}</code></td></tr>\
<tr><th>retained for</th><td>{}</td></tr>",
        Esc(tenant),
        Esc(key),
        record_state(record),
        record.attempt(),
        Esc(&record.fingerprint().to_string()),
        until(record.retained_until()),
    );
    if let idem_core::store::RecordState::Completed { response } = record.state() {
        let payload = crate::view::Payload::of(response.body());
        let _ = write!(
            body,
            "<tr><th>response</th><td>{} {}</td></tr>",
            response.status(),
            payload_cell(&payload.data)
        );
    }
    body.push_str("</table>");
    body.push_str(&action_form(
        ctx,
        Action::RecordDelete,
        &[("tenant", tenant), ("key", key)],
        "Delete…",
    ));
    body.push_str("</section>");
    body
}

async fn record(State(shared): State<Shared>, ctx: Ctx, Form(lookup): Form<Lookup>) -> Response {
    if !shared.guard.csrf.verify(&ctx.operator, &lookup.csrf) {
        return forged(&ctx, &shared);
    }
    let wanted = RecordRef::new(&lookup.tenant, &lookup.key);
    match shared.admin.read_record(&ctx.operator, &wanted).await {
        Ok(record) => {
            Html(layout(&ctx, &shared, "Record", &record_body(&ctx, &record))).into_response()
        }
        Err(error) => error_page(&ctx, &shared, &error, ""),
    }
}

/// An action's form: what it is, to what, and, for a final one, the
/// operator's confirmation and reason.
#[derive(Deserialize)]
struct ActForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    consumer: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    effect: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    provider_id: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    confirm: String,
}

impl ActForm {
    /// The page to go back to after `action`.
    fn back(&self, action: Action) -> String {
        match action {
            Action::OutboxRetry | Action::OutboxDrop => "/outbox".into(),
            Action::ConsumerReplay | Action::ConsumerDrop => {
                format!("/consumers/{}", url_part(&self.consumer))
            }
            Action::JournalSettle => format!("/journals/{}", url_part(&self.namespace)),
            _ => String::new(),
        }
    }

    /// What a final action will do, in words, and the fields it keeps.
    fn describe(&self, action: Action) -> (String, Vec<(&'static str, &str)>) {
        match action {
            Action::OutboxDrop => (
                format!(
                    "Drop outbox message {}: it is never published, and its aggregate's later messages flow again.",
                    self.id
                ),
                vec![("id", &self.id)],
            ),
            Action::ConsumerDrop => (
                format!(
                    "Drop message {} parked by consumer {}: it is never applied.",
                    self.id, self.consumer
                ),
                vec![("consumer", &self.consumer), ("id", &self.id)],
            ),
            Action::RecordDelete => (
                format!(
                    "Delete the record of key {} in tenant {}: the next request with this key runs again.",
                    self.key, self.tenant
                ),
                vec![("tenant", &self.tenant), ("key", &self.key)],
            ),
            _ => (
                format!(
                    "Settle operation {}/{} of journal {} as {}{}, noting \u{201c}{}\u{201d}: a settled operation never changes again.",
                    self.subject,
                    self.effect,
                    self.namespace,
                    self.outcome,
                    if self.provider_id.is_empty() {
                        String::new()
                    } else {
                        format!(" (provider's id {})", self.provider_id)
                    },
                    self.note
                ),
                vec![
                    ("namespace", &self.namespace),
                    ("subject", &self.subject),
                    ("effect", &self.effect),
                    ("outcome", &self.outcome),
                    ("provider_id", &self.provider_id),
                    ("note", &self.note),
                ],
            ),
        }
    }
}

/// The confirmation of a final action: what it does, a reason where it
/// keeps one, and a box to tick; the form posts again with `confirm=yes`.
fn confirm_page(ctx: &Ctx, shared: &Shared, action: Action, form: &ActForm) -> Response {
    let (what, fields) = form.describe(action);
    let mut body = format!(
        "<section id=\"confirm\"><p class=\"danger\">{}</p><form method=\"post\" action=\"{}/act\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"{}\">",
        Esc(&what),
        ctx.prefix,
        Esc(&ctx.token),
        action.as_str()
    );
    for (name, value) in fields {
        let _ = write!(
            body,
            "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
            Esc(value)
        );
    }
    if matches!(action, Action::OutboxDrop | Action::ConsumerDrop) {
        body.push_str("<label>Reason (kept with the message) <textarea name=\"reason\" required rows=\"3\"></textarea></label>");
    }
    let _ = write!(
        body,
        "<label><input type=\"checkbox\" name=\"confirm\" value=\"yes\" required> I understand this cannot be undone</label>\
<button type=\"submit\" class=\"danger\">Confirm</button> <a href=\"{}\">cancel</a></form></section>",
        ctx.href(&form.back(action))
    );
    Html(layout(ctx, shared, "Confirm", &body)).into_response()
}

fn done_page(ctx: &Ctx, shared: &Shared, done: &Done, back: &str) -> Response {
    let what = if done.changed {
        format!("{}: done, now {}", done.action.as_str(), done.state)
    } else {
        format!(
            "{}: nothing changed, it was done before: {}",
            done.action.as_str(),
            done.state
        )
    };
    let detail = done
        .detail
        .as_deref()
        .map_or(String::new(), |d| format!("<p>{}</p>", Esc(d)));
    let body = format!(
        "<section class=\"done\" id=\"done\" data-changed=\"{}\" data-state=\"{}\"><p>{}</p>{detail}<p><a href=\"{}\">back</a></p></section>",
        done.changed,
        Esc(&done.state),
        Esc(&what),
        ctx.href(back)
    );
    Html(layout(ctx, shared, "Done", &body)).into_response()
}

async fn act(State(shared): State<Shared>, ctx: Ctx, Form(form): Form<ActForm>) -> Response {
    if !shared.guard.csrf.verify(&ctx.operator, &form.csrf) {
        return forged(&ctx, &shared);
    }
    let Some(action) = Action::parse(&form.action).filter(|a| *a != Action::RecordRead) else {
        let error = AdminError::InvalidInput(idem_core::InvalidInput::Malformed {
            field: "action",
            reason: "not an action of the console".into(),
        });
        return error_page(&ctx, &shared, &error, "");
    };
    if action.is_final() && form.confirm != "yes" {
        return confirm_page(&ctx, &shared, action, &form);
    }
    let admin = &shared.admin;
    let operator = &ctx.operator;
    let done = match action {
        Action::OutboxRetry => admin.retry_outbox(operator, &form.id).await,
        Action::OutboxDrop => admin.drop_outbox(operator, &form.id, &form.reason).await,
        Action::ConsumerReplay => admin.replay(operator, &form.consumer, &form.id).await,
        Action::ConsumerDrop => {
            admin
                .drop_parked(operator, &form.consumer, &form.id, &form.reason)
                .await
        }
        Action::RecordDelete => {
            let record = RecordRef::new(&form.tenant, &form.key);
            admin.delete_record(operator, &record).await
        }
        _ => match Outcome::parse(&form.outcome) {
            Some(outcome) => {
                let settlement = Settlement::new(&form.subject, &form.effect, outcome, &form.note)
                    .with_provider_id(Some(form.provider_id.clone()));
                admin.settle(operator, &form.namespace, &settlement).await
            }
            None => Err(AdminError::InvalidInput(
                idem_core::InvalidInput::Malformed {
                    field: "outcome",
                    reason: "succeeded or failed".into(),
                },
            )),
        },
    };
    let back = form.back(action);
    match done {
        Ok(done) => done_page(&ctx, &shared, &done, &back),
        Err(error) => error_page(&ctx, &shared, &error, &back),
    }
}
