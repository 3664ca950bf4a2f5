-- idem: a message consumer's parked messages (PostgreSQL 12+), for
-- PostgresParking.
--
-- Every statement is idempotent. Run this file as it is for the default table
-- name `idem_parked`, or take PostgresParking::migration_sql(), which is this
-- text with the table name replaced, for another name.
--
-- One row per consumer and message id: parking a message again updates its
-- row. Every time is a bigint of whole milliseconds since the Unix epoch, by
-- the server's clock_timestamp().

CREATE TABLE IF NOT EXISTS idem_parked (
    consumer      text   NOT NULL,
    id            text   NOT NULL,
    kind          text   NOT NULL,
    aggregate     text,
    version       bigint CHECK (version >= 1),
    header_names  text[] NOT NULL,
    header_values text[] NOT NULL,
    payload       bytea  NOT NULL,
    reason        text   NOT NULL,
    deliveries    bigint NOT NULL CHECK (deliveries BETWEEN 0 AND 4294967295),
    -- ParkedState::as_str; unchecked here, so a state a later version adds
    -- needs no migration (a name no version writes reads as corrupt).
    state         text   NOT NULL,
    parked_at     bigint NOT NULL,
    resolved_at   bigint,
    resolution    text,
    PRIMARY KEY (consumer, id)
);

-- A consumer's parked messages, oldest first, and counted.
CREATE INDEX IF NOT EXISTS idem_parked_waiting_idx ON idem_parked (consumer, parked_at, id)
    WHERE state = 'parked';

-- One aggregate's parked messages by version: what a filled gap releases.
CREATE INDEX IF NOT EXISTS idem_parked_aggregate_idx ON idem_parked (consumer, aggregate, version)
    WHERE state = 'parked';

-- A purge finds resolved messages by when they were resolved.
CREATE INDEX IF NOT EXISTS idem_parked_resolved_idx ON idem_parked (resolved_at)
    WHERE state <> 'parked';

-- The server's clock in whole milliseconds.
CREATE OR REPLACE FUNCTION idem_parked_now()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT (extract(epoch FROM date_trunc('milliseconds', clock_timestamp())) * 1000)::bigint
$$;
