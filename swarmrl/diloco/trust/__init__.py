"""DiLoCo trusting no one: workers are protocol members, every pseudo-gradient is signed and bound to its round,
and the outer step aggregates only what an aggregator (a validator principal of the orchestrator) judged honest.

Topology: instead of an all-reduce among the workers (which hides who sent what), each worker uploads its own
int8 pseudo-gradient to the **aggregator** (a real HTTP server, FastAPI/uvicorn), which checks it, scores it on a
batch the worker could not choose, aggregates the contributions it accepts, and serves the round's outer update to
every worker. Judgements go to the orchestrator in one signed call per round: accepted contributions earn credit,
hostile ones are slashed and their node ejected, through the same ledger as rollouts.

Modules:

* ``wire``: the upload and result formats (safetensors bytes: int8 codes + fp32 chunk scales + metadata) and
  their validation (size before and after decoding, dtype, shape, finiteness, round, anchor digest);
* ``judge``: pure math: per-contribution statistics (norm, loss change on the aggregator's scoring batch,
  similarity to recent contributions and published updates via a count sketch), the verdict rules and the robust
  aggregate; never imports servers;
* ``aggregator``: the HTTP server (``python -m swarmrl.diloco.trust.aggregator --config CFG.json --key KEY.pem
  --orchestrator URL --port P [--ready-file F] [--log ROUNDS.jsonl]``) over ``rounds``, the round state machine;
  ``scoring``: the aggregator's model and scoring batches; ``calibration``: honest pseudo-gradients and the five
  attacks in process (the judge's calibration and tests);
* ``client``: ``SwarmAverager``, the worker's side (``average(pg, round) -> AverageResult``);
* ``launch``: orchestrator + aggregator + W workers on loopback, every process dying with its parent.

HTTP API of the aggregator (every POST signed with the protocol's request signing, ``swarmrl.protocol.signing``):

* ``GET  /v1/diloco/run``: JSON ``{run_id, numel, int8_chunk, inner_steps, outer_lr, outer_momentum, round,
  anchor_digest, max_upload_bytes, aggregate, members, ejected, pending, outer_steps, reported_rounds}`` (the last
  five: node ids joined / ejected / uploaded to the open round, outer steps taken, the last round the orchestrator
  took the report of);
* ``POST /v1/diloco/join``: signed, empty body; 200 JSON ``{node_id, round}`` once the orchestrator lists the key
  as an active registered worker (``GET /v1/nodes/{id}``); 403 otherwise (503 if the orchestrator cannot be
  asked). A round waits until ``cfg.workers`` members have joined and every joined, non-ejected member uploaded,
  or ``round_timeout_s`` (from the round's opening; at least one upload); a member that misses a round is not
  punished;
* ``GET  /v1/diloco/state``: safetensors: ``anchor`` (fp32 [numel]), ``momentum`` (fp32 [numel], or [0] before
  the first outer step); metadata ``{"round", "outer_steps", "anchor_digest"}`` (strings);
* ``POST /v1/diloco/rounds/{r}/contributions``: signed; body safetensors: ``codes`` (int8 [numel]), ``scales``
  (fp32 [ceil(numel / int8_chunk)]); metadata ``{"run_id", "round", "anchor_digest"}``. 202 when taken for
  judging; 401 unsigned, bad signature, replayed nonce, or body not the signed one; 403 not a joined member (or
  ejected); 409 wrong round (closed, being judged, or not open), duplicate, another run, or anchor digest not the
  round's; 413 too large (by Content-Length before reading, or counted while streaming); 422 malformed (not
  safetensors, wrong names, dtype or shape, NaN or infinite scales, scales whose dequantized values overflow, bad
  metadata). The checks run in that order, signature and membership before the body is read. Nothing refused
  touches the outer state. ``scales`` are the chunk scales (absmax / 127): the vector is ``codes * scales``
  chunk-wise (``wire.quantize`` / ``wire.dequantize``, ``wire.encode_upload``).
* ``GET  /v1/diloco/rounds/{r}/result?wait=S``: a long poll; 200 safetensors ``codes`` (int8), ``scales`` (fp32):
  the published outer update (the aggregate, int8 chunk-scaled: every party dequantizes the same bytes and applies
  the same Nesterov step: ``wire.decode_result(...).vector(chunk)``); metadata ``{"round", "anchor_digest",
  "accepted" (JSON list of node ids), "rejected" (JSON list of {node_id, reason}), "anchor_digest_after",
  "score_seed" (the scoring batch's secret seed, revealed now)}``; 204 if not ready within ``wait`` (at most 60
  s); 404 for a round no longer kept (the last 64 are). A round with no accepted contribution publishes a zero
  update (every party still takes the step: the momentum moves the anchors alike).

Judgements reach the orchestrator as ``POST /v1/validator/diloco/rounds`` (``ValidatorClient.diloco_round``,
signed by the aggregator's validator key) from a reporter thread, in order, retried until they land (the endpoint
is idempotent per run, round and node): each accepted node is credited ``diloco_credit_per_round`` (locked for the
challenge window), each rejected node slashed (``slash_fraction`` of its stake, its in-window credits revoked) and
ejected, visible in ``GET /v1/nodes/{id}/ledger`` (notes ``DiLoCo run R round r: ...``).
"""
