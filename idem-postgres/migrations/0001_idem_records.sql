-- idem: the record table and its one-round-trip claim function (PostgreSQL 12+).
--
-- Every statement is idempotent. Run this file as it is for the default table
-- name `idem_records`, or take PostgresStore::migration_sql(), which is this
-- text with the table name replaced, for another name.
--
-- Times are whole milliseconds of the server's clock_timestamp(): now() is
-- frozen at the start of a transaction, and a claim or completion may run
-- late inside a caller's long transaction.

CREATE TABLE IF NOT EXISTS idem_records (
    tenant                 text        NOT NULL,
    key                    text        NOT NULL,
    fingerprint            bytea       NOT NULL,
    owner                  uuid        NOT NULL,
    attempt                integer     NOT NULL,
    status                 text        NOT NULL CHECK (status IN ('in_flight', 'completed')),
    lease_expires_at       timestamptz,
    expires_at             timestamptz NOT NULL,
    checkpoint_name        text,
    checkpoint_data        text,
    response_status        integer,
    response_header_names  bytea[],
    response_header_values bytea[],
    response_body          bytea,
    PRIMARY KEY (tenant, key)
);

-- purge_expired walks this index in bounded batches.
CREATE INDEX IF NOT EXISTS idem_records_expires_at_idx ON idem_records (expires_at);

-- The claim decision table in one round trip.
--
-- INSERT ... ON CONFLICT DO NOTHING takes no lock and writes nothing when the
-- row exists, so a replay or an in-progress answer writes no tuple and no
-- WAL. Each statement of a volatile PL/pgSQL function takes a fresh snapshot,
-- so the SELECT after the INSERT sees a row that a racing claim committed
-- while the INSERT waited for it (a single-statement CTE would not). The
-- UPDATEs re-check their guards on the latest row version, so of racing
-- takeovers exactly one wins and the others read the winner on the next lap.
CREATE OR REPLACE FUNCTION idem_records_claim(
    p_tenant       text,
    p_key          text,
    p_fingerprint  bytea,
    p_owner        uuid,
    p_lease_ms     bigint,
    p_retention_ms bigint
)
RETURNS TABLE (
    o_outcome                text,
    o_attempt                integer,
    o_lease_expires_ms       bigint,
    o_checkpoint_name        text,
    o_checkpoint_data        text,
    o_response_status        integer,
    o_response_header_names  bytea[],
    o_response_header_values bytea[],
    o_response_body          bytea,
    o_retry_after_ms         bigint
)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now   timestamptz;
    v_lease timestamptz;
    v_keep  interval := greatest(p_lease_ms, p_retention_ms) * interval '1 millisecond';
    v_row   idem_records%ROWTYPE;
BEGIN
    FOR lap IN 1..8 LOOP
        v_now := date_trunc('milliseconds', clock_timestamp());
        v_lease := v_now + p_lease_ms * interval '1 millisecond';
        INSERT INTO idem_records AS r
            (tenant, key, fingerprint, owner, attempt, status, lease_expires_at, expires_at)
        VALUES (p_tenant, p_key, p_fingerprint, p_owner, 1, 'in_flight', v_lease, v_now + v_keep)
        ON CONFLICT (tenant, key) DO NOTHING;
        IF FOUND THEN
            RETURN QUERY SELECT 'claimed', 1,
                (extract(epoch FROM v_lease) * 1000)::bigint,
                NULL::text, NULL::text, NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea,
                NULL::bigint;
            RETURN;
        END IF;

        SELECT * INTO v_row FROM idem_records AS r WHERE r.tenant = p_tenant AND r.key = p_key;
        -- Released or purged since the INSERT: try the INSERT again.
        CONTINUE WHEN NOT FOUND;
        -- The INSERT may have waited on a racing claim: judge by the time now.
        v_now := date_trunc('milliseconds', clock_timestamp());
        v_lease := v_now + p_lease_ms * interval '1 millisecond';

        IF v_row.expires_at <= v_now THEN
            -- Past retention counts as absent: claim afresh, whatever the fingerprint.
            UPDATE idem_records AS r
            SET fingerprint = p_fingerprint, owner = p_owner, attempt = 1, status = 'in_flight',
                lease_expires_at = v_lease, expires_at = v_now + v_keep,
                checkpoint_name = NULL, checkpoint_data = NULL, response_status = NULL,
                response_header_names = NULL, response_header_values = NULL, response_body = NULL
            WHERE r.tenant = p_tenant AND r.key = p_key AND r.expires_at <= v_now;
            IF FOUND THEN
                RETURN QUERY SELECT 'claimed', 1,
                    (extract(epoch FROM v_lease) * 1000)::bigint,
                    NULL::text, NULL::text, NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea,
                    NULL::bigint;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        IF v_row.fingerprint <> p_fingerprint THEN
            RETURN QUERY SELECT 'mismatch', NULL::integer, NULL::bigint, NULL::text, NULL::text,
                NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea, NULL::bigint;
            RETURN;
        END IF;

        IF v_row.status = 'completed' THEN
            RETURN QUERY SELECT 'completed', v_row.attempt, NULL::bigint, NULL::text, NULL::text,
                v_row.response_status, v_row.response_header_names, v_row.response_header_values,
                v_row.response_body, NULL::bigint;
            RETURN;
        END IF;

        IF v_row.owner = p_owner THEN
            -- This very claim, delivered again: answer as the first delivery did.
            RETURN QUERY SELECT 'claimed', v_row.attempt,
                (extract(epoch FROM v_row.lease_expires_at) * 1000)::bigint,
                v_row.checkpoint_name, v_row.checkpoint_data, NULL::integer, NULL::bytea[],
                NULL::bytea[], NULL::bytea, NULL::bigint;
            RETURN;
        END IF;

        IF v_row.lease_expires_at > v_now THEN
            RETURN QUERY SELECT 'in_progress', v_row.attempt, NULL::bigint, NULL::text, NULL::text,
                NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea,
                (extract(epoch FROM v_row.lease_expires_at - v_now) * 1000)::bigint;
            RETURN;
        END IF;

        -- The lease expired: take over, unless another claim already did.
        UPDATE idem_records AS r
        SET owner = p_owner, attempt = r.attempt + 1, lease_expires_at = v_lease,
            expires_at = greatest(r.expires_at, v_now + v_keep)
        WHERE r.tenant = p_tenant AND r.key = p_key AND r.owner = v_row.owner
          AND r.status = 'in_flight' AND r.lease_expires_at <= v_now AND r.expires_at > v_now
        RETURNING r.attempt, r.checkpoint_name, r.checkpoint_data
        INTO v_row.attempt, v_row.checkpoint_name, v_row.checkpoint_data;
        IF FOUND THEN
            RETURN QUERY SELECT 'claimed', v_row.attempt,
                (extract(epoch FROM v_lease) * 1000)::bigint,
                v_row.checkpoint_name, v_row.checkpoint_data, NULL::integer, NULL::bytea[],
                NULL::bytea[], NULL::bytea, NULL::bigint;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idem: claim did not settle after 8 laps' USING ERRCODE = '40001';
END
$$;

-- Claims many records and completes at once, with one response, each it
-- claims (the inbox of a consumer's batch): one round trip, one write per
-- free record. The common case, every record new, is one plain INSERT of
-- them all: a record that was there (or that a racing batch committed
-- while the INSERT waited for it) aborts it, the block's subtransaction
-- undoes it, and the batch goes the careful way. A plain INSERT checks
-- each key once as it inserts; ON CONFLICT searches the index first and
-- inserts speculatively, which cost a third of this function's time.
-- The careful way: one INSERT ... ON CONFLICT DO NOTHING writes the free
-- ones completed, in key order (two batches never wait on each other in a
-- cycle); a record that was there is read back through the claim
-- function, which takes a fresh snapshot (it sees what a racing batch
-- committed while the INSERT waited for it), and completed if that claim
-- claims it (a lapsed lease, past retention). Answers one row,
-- 'recorded_all', when the plain INSERT took every request; else a row
-- per request, in their order: 'recorded', or the claim's answer. Each
-- scope appears once among the requests (the caller checks).
CREATE OR REPLACE FUNCTION idem_records_claim_completed(
    p_tenants        text[],
    p_keys           text[],
    p_fingerprints   bytea[],
    p_owners         uuid[],
    p_lease_ms       bigint[],
    p_retention_ms   bigint[],
    p_status         integer,
    p_header_names   bytea[],
    p_header_values  bytea[],
    p_body           bytea
)
RETURNS TABLE (
    o_outcome                text,
    o_attempt                integer,
    o_lease_expires_ms       bigint,
    o_checkpoint_name        text,
    o_checkpoint_data        text,
    o_response_status        integer,
    o_response_header_names  bytea[],
    o_response_header_values bytea[],
    o_response_body          bytea,
    o_retry_after_ms         bigint
)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now      timestamptz := date_trunc('milliseconds', clock_timestamp());
    v_recorded bigint[];
    v_claim    record;
BEGIN
    BEGIN
        INSERT INTO idem_records
            (tenant, key, fingerprint, owner, attempt, status, lease_expires_at, expires_at,
             response_status, response_header_names, response_header_values, response_body)
        SELECT q.tenant, q.key, q.fingerprint, q.owner, 1, 'completed', NULL,
            v_now + q.retention_ms * interval '1 millisecond',
            p_status, p_header_names, p_header_values, p_body
        FROM unnest(p_tenants, p_keys, p_fingerprints, p_owners, p_retention_ms)
            AS q(tenant, key, fingerprint, owner, retention_ms)
        ORDER BY q.tenant, q.key;
        -- One row answers for them all.
        RETURN QUERY SELECT 'recorded_all', 1, NULL::bigint, NULL::text, NULL::text,
            NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea, NULL::bigint;
        RETURN;
    EXCEPTION WHEN unique_violation THEN
        -- A record was there: the careful way below.
        NULL;
    END;

    WITH q AS (
        SELECT * FROM unnest(p_tenants, p_keys, p_fingerprints, p_owners, p_retention_ms)
            WITH ORDINALITY AS q(tenant, key, fingerprint, owner, retention_ms, n)
    ), done AS (
        INSERT INTO idem_records AS r
            (tenant, key, fingerprint, owner, attempt, status, lease_expires_at, expires_at,
             response_status, response_header_names, response_header_values, response_body)
        SELECT q.tenant, q.key, q.fingerprint, q.owner, 1, 'completed', NULL,
            v_now + q.retention_ms * interval '1 millisecond',
            p_status, p_header_names, p_header_values, p_body
        FROM q ORDER BY q.tenant, q.key
        ON CONFLICT (tenant, key) DO NOTHING
        RETURNING r.tenant, r.key
    )
    SELECT coalesce(array_agg(q.n), '{}') INTO v_recorded
    FROM q JOIN done ON done.tenant = q.tenant AND done.key = q.key;

    FOR i IN 1..coalesce(array_length(p_keys, 1), 0) LOOP
        IF i = ANY (v_recorded) THEN
            RETURN QUERY SELECT 'recorded', 1, NULL::bigint, NULL::text, NULL::text,
                NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea, NULL::bigint;
            CONTINUE;
        END IF;
        SELECT * INTO v_claim FROM idem_records_claim(p_tenants[i], p_keys[i],
            p_fingerprints[i], p_owners[i], p_lease_ms[i], p_retention_ms[i]);
        IF v_claim.o_outcome = 'claimed' THEN
            UPDATE idem_records AS r
            SET status = 'completed', lease_expires_at = NULL,
                expires_at = date_trunc('milliseconds', clock_timestamp())
                    + p_retention_ms[i] * interval '1 millisecond',
                response_status = p_status, response_header_names = p_header_names,
                response_header_values = p_header_values, response_body = p_body,
                checkpoint_name = NULL, checkpoint_data = NULL
            WHERE r.tenant = p_tenants[i] AND r.key = p_keys[i] AND r.owner = p_owners[i];
            RETURN QUERY SELECT 'recorded', v_claim.o_attempt, NULL::bigint, NULL::text,
                NULL::text, NULL::integer, NULL::bytea[], NULL::bytea[], NULL::bytea,
                NULL::bigint;
        ELSE
            RETURN QUERY SELECT v_claim.o_outcome, v_claim.o_attempt,
                v_claim.o_lease_expires_ms, v_claim.o_checkpoint_name,
                v_claim.o_checkpoint_data, v_claim.o_response_status,
                v_claim.o_response_header_names, v_claim.o_response_header_values,
                v_claim.o_response_body, v_claim.o_retry_after_ms;
        END IF;
    END LOOP;
END
$$;
