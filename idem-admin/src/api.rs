//! The JSON API: every part's figures and lists, and every action, each
//! answered as JSON or as an RFC 9457 problem. Idempotency keys and the
//! ids of consumed messages (a producer's, which can be personal data)
//! travel in request bodies, never in URLs (which access logs keep); an
//! outbox message's id, a UUID idem drew, is in its routes' paths.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_core::store::MAX_LIST;
use idem_http::ProblemDetails;
use serde::{Deserialize, Serialize};

use crate::error::AdminError;
use crate::journal::Settlement;
use crate::records::RecordRef;
use crate::security::Operator;
use crate::shared::Shared;
use crate::view::Page;

/// The API's routes, under `api/`.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/openapi.json", get(openapi))
        .route("/api/summary", get(summary))
        .route("/api/records/read", post(read_record))
        .route("/api/records/delete", post(delete_record))
        .route("/api/outbox", get(outbox))
        .route("/api/outbox/parked", get(outbox_parked))
        .route("/api/outbox/messages/{id}", get(outbox_message))
        .route("/api/outbox/messages/{id}/retry", post(outbox_retry))
        .route("/api/outbox/messages/{id}/drop", post(outbox_drop))
        .route("/api/consumers/{name}/parked", get(consumer_parked))
        .route("/api/consumers/{name}/stuck", get(consumer_stuck))
        .route("/api/consumers/{name}/replay", post(consumer_replay))
        .route("/api/consumers/{name}/drop", post(consumer_drop))
        .route("/api/journals/{namespace}/attention", get(attention))
        .route("/api/journals/{namespace}/settle", post(settle))
}

/// A request the API could not read, as a problem.
fn unreadable(status: http::StatusCode, detail: String) -> Response {
    ProblemDetails::new(status, detail)
        .with_extension("error", "invalid_input")
        .into_response()
        .into_response()
}

/// A body's JSON, or the problem of why it is not.
fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Box<Response>> {
    body.map(|Json(value)| value)
        .map_err(|rejection| Box::new(unreadable(rejection.status(), rejection.body_text())))
}

/// A query's parameters, or the problem of why they are not.
fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Box<Response>> {
    query
        .map(|Query(value)| value)
        .map_err(|rejection| Box::new(unreadable(rejection.status(), rejection.body_text())))
}

/// The answer of a call: its JSON, or its problem.
fn answer<T: Serialize>(result: Result<T, AdminError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn openapi() -> Response {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        crate::OPENAPI,
    )
        .into_response()
}

async fn summary(State(shared): State<Shared>) -> Response {
    Json(shared.admin.summary().await).into_response()
}

async fn read_record(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    record: Result<Json<RecordRef>, JsonRejection>,
) -> Response {
    match body(record) {
        Ok(record) => answer(shared.admin.read_record(&operator, &record).await),
        Err(problem) => *problem,
    }
}

async fn delete_record(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    record: Result<Json<RecordRef>, JsonRejection>,
) -> Response {
    match body(record) {
        Ok(record) => answer(shared.admin.delete_record(&operator, &record).await),
        Err(problem) => *problem,
    }
}

async fn outbox(State(shared): State<Shared>) -> Response {
    answer(shared.admin.outbox_summary().await)
}

async fn outbox_parked(
    State(shared): State<Shared>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    match query(page) {
        Ok(page) => answer(shared.admin.outbox_parked(page).await),
        Err(problem) => *problem,
    }
}

async fn outbox_message(State(shared): State<Shared>, Path(id): Path<String>) -> Response {
    answer(shared.admin.outbox_message(&id).await)
}

async fn outbox_retry(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    Path(id): Path<String>,
) -> Response {
    answer(shared.admin.retry_outbox(&operator, &id).await)
}

/// A drop's reason.
#[derive(Deserialize)]
struct Reason {
    reason: String,
}

async fn outbox_drop(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    Path(id): Path<String>,
    reason: Result<Json<Reason>, JsonRejection>,
) -> Response {
    match body(reason) {
        Ok(Reason { reason }) => answer(shared.admin.drop_outbox(&operator, &id, &reason).await),
        Err(problem) => *problem,
    }
}

async fn consumer_parked(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    match query(page) {
        Ok(page) => answer(shared.admin.consumer_parked(&name, page).await),
        Err(problem) => *problem,
    }
}

async fn consumer_stuck(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    match query(page) {
        Ok(page) => answer(shared.admin.consumer_stuck(&name, page).await),
        Err(problem) => *problem,
    }
}

/// A parked message, and the reason to drop it.
#[derive(Deserialize)]
struct Parked {
    id: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn consumer_replay(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    Path(name): Path<String>,
    parked: Result<Json<Parked>, JsonRejection>,
) -> Response {
    match body(parked) {
        Ok(parked) => answer(shared.admin.replay(&operator, &name, &parked.id).await),
        Err(problem) => *problem,
    }
}

async fn consumer_drop(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    Path(name): Path<String>,
    parked: Result<Json<Parked>, JsonRejection>,
) -> Response {
    match body(parked) {
        Ok(parked) => {
            let reason = parked.reason.unwrap_or_default();
            answer(
                shared
                    .admin
                    .drop_parked(&operator, &name, &parked.id, &reason)
                    .await,
            )
        }
        Err(problem) => *problem,
    }
}

/// How many operations to list.
#[derive(Deserialize)]
struct Limit {
    #[serde(default = "max_list")]
    limit: usize,
}

fn max_list() -> usize {
    MAX_LIST
}

async fn attention(
    State(shared): State<Shared>,
    Path(namespace): Path<String>,
    limit: Result<Query<Limit>, QueryRejection>,
) -> Response {
    match query(limit) {
        Ok(Limit { limit }) => answer(shared.admin.attention(&namespace, limit).await),
        Err(problem) => *problem,
    }
}

async fn settle(
    State(shared): State<Shared>,
    Extension(operator): Extension<Operator>,
    Path(namespace): Path<String>,
    settlement: Result<Json<Settlement>, JsonRejection>,
) -> Response {
    match body(settlement) {
        Ok(settlement) => answer(
            shared
                .admin
                .settle(&operator, &namespace, &settlement)
                .await,
        ),
        Err(problem) => *problem,
    }
}
