-- KV browsing for the dashboard's KV page: GET /api/v1/kv/namespaces and GET /api/v1/kv/keys
-- (queen_pg/api/kv/browse.py). Both read only.
--
-- queen.kv_namespaces_v1(tenant, after, limit) -> TABLE(ns text)
--   Called by: GET /api/v1/kv/namespaces (queen_pg/api/kv/browse.py, queen_pg/engine/kv.py).
--   Inputs: after = the page after this namespace (exclusive, NULL = from the first); limit = rows wanted
--   (the caller asks for one more than it shows, to know whether the page is truncated).
--   Result: the tenant's distinct namespaces in ascending order (the collation of kv_pkey), at most
--   `limit`. A skip scan of kv_pkey (tenant, ns, key): one index probe per namespace, however many keys
--   each holds. A namespace whose keys have all expired is listed until the kv_sweep job deletes them
--   (its prefix browse answers no rows meanwhile).
--   Locks: none (a read; it sees what committed before the statement). Reads no clock. Raises nothing.
--
-- queen.kv_keys_v2(tenant, ns, prefix, after, limit, keys_only, now, max_bytes) -> jsonb
--   Called by: GET /api/v1/kv/keys (queen_pg/api/kv/browse.py, queen_pg/engine/kv.py).
--   The getPrefix op of POST /api/v1/kv (queen._kv_get_prefix, 080_kv.sql) with an EMPTY prefix
--   allowed: the op's validator wants a non-empty prefix (docs/wire.md#kv), a browser wants a whole
--   namespace. Result, paging and clamping as getPrefix: {prefix, rows, truncated, nextAfter}, byte
--   order of key, `after` exclusive, limit clamped to 1..1000, expired rows (expires_at <= now) absent.
--   The page also stops before the row that would take its rows' JSON text past max_bytes (the
--   answer budget; at least one row; NULL = no limit): truncated, nextAfter = its last row.
--   Locks: none (a read). Time only from p_now (NULL = now()). Raises nothing.

CREATE OR REPLACE FUNCTION queen.kv_namespaces_v1(p_tenant text, p_after text, p_limit integer)
RETURNS TABLE(ns text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE walk(ns) AS (
        (SELECT k.ns FROM queen.kv k
          WHERE k.tenant = p_tenant AND (p_after IS NULL OR k.ns > p_after)
          ORDER BY k.ns LIMIT 1)
        UNION ALL
        SELECT (SELECT k.ns FROM queen.kv k WHERE k.tenant = p_tenant AND k.ns > walk.ns ORDER BY k.ns LIMIT 1)
          FROM walk
         WHERE walk.ns IS NOT NULL
    )
    SELECT walk.ns FROM walk WHERE walk.ns IS NOT NULL LIMIT greatest(p_limit, 0);
$$;

CREATE OR REPLACE FUNCTION queen.kv_keys_v2(
    p_tenant text, p_ns text, p_prefix text, p_after text, p_limit integer, p_keys_only boolean,
    p_now timestamptz, p_max_bytes bigint
)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT queen._kv_get_prefix(
        p_tenant,
        jsonb_build_object('ns', p_ns, 'prefix', coalesce(p_prefix, ''), 'after', p_after, 'limit', p_limit,
                           'keysOnly', coalesce(p_keys_only, false)),
        coalesce(p_now, now()), p_max_bytes);
$$;
