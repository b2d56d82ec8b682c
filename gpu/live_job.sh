#!/bin/bash
# Issue 18 on ONE lent H200, 1,800 device seconds in all (staging included): vLLM with real weights, live.
# The engine specs, their order and their seconds are spec_repro/engines/vllm/session.py's; `plan` prints them (CPU,
# no vLLM) and fails when the total passes the plan limit (1,650 s). PREPARED, NOT YET RUN ON A GPU.
#
# Plan (device seconds; calls back to back: the machine goes 30 s after a call returns). Estimated:
#   stage      calls  seconds  what
#   first        1    ~30      machine start
#   vllm         6    ~40      .stage/c1..c7 (vLLM 0.25.0; c6+c7 in one call)     bash gpu/live_job.sh vllm cN
#   piece       27    ~140     .carry/p00..p26: Qwen 1.5B + 0.5B GGUFs, the head, 5 workloads (60 MiB pieces)
#   setup        1    ~195     install vLLM, reassemble + verify the cache, convert both GGUFs, plugin entry point
#   run   1 + polls   ~1,130   detached, resumable (a marker per part, run_specs skips finished engines):
#                               a ~400: Qwen + head k=5 (agreement prompts + hybrid task), n-gram (same), 0.5B
#                                       draft (agreement prompts), then predict (the profiler on vLLM's outputs,
#                                       GPU) and agreement -> res/qwen/qwen_agreement.json       [Must show 3]
#                               b ~370: no SD, pr24344, pr24344-skip (code-edit, bs 1/8/32/64, 3 repeats) and the
#                                       lossless check -> res/qwen/lossless.jsonl                [Must show 4]
#                               c ~230: Llama-3.1-8B dims, dummy weights, no SD: default vs study-like engine,
#                                       bs 1/16/64/256, 512-token prompt, 256 tokens, warmed, 3 repeats [Must show 2]
#                               d ~160: EAGLE drafting time, Qwen head at k = 1, 12 (k = 5 from a), bs 1/8/32/64
#   pack      1 per part  ~10  each part's results as soon as its marker exists
#   In all ~1,550 of 1,800 (`bash gpu/live_job.sh plan` prints the per-engine estimates).
#   Deferred to a second session: sharegpt for (a)+(b), adaptive-rule (needs a cost model fitted on this run's
#   Qwen steps: `jobs summarize` here first), drafting time at the other k and on Llama dims, the idle-hybrid plugin
#   overhead, `spec-repro reproduce --profile gpu` (its llama8b job alone is ~450 s).
#
# The session, call by call (`run` tool; kind nvidia-h200). Before the staging calls, here:
#   bash ../shared/gpu/prepare.sh                            # .stage/c1..c7, .stage/run
#   WORKLOADS="code-edit sharegpt humaneval mt-bench gsm-symbolic" HEADS=6a8986521a4253cc1bc5e12812989cf7f59fd27b1a010b549a637b3e37ca1a44 \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b qwen2.5-coder-0.5b      # .carry/p00..p26 + .carry/extra
#   bash gpu/live_job.sh plan                                # must say it fits
#   mkdir -p .aside && mv data notebooks figures .aside/     # 60 MiB pieces + the tree (~1.6 MB) < 64 MiB a call
#   git rm -r --cached -q data notebooks figures             # (what the fourth and fifth sessions did; undone below)
#     (.aside/ is in .git/info/exclude: `grep -qx /.aside/ .git/info/exclude || echo /.aside/ >> .git/info/exclude`)
#  1-6  carry [".stage/cN"]                   bash gpu/live_job.sh vllm cN          (N = 1..5; the 6th: c6 and c7:
#       carry [".stage/c6", ".stage/c7"]      bash gpu/live_job.sh vllm c6 c7)
#  7-33 carry [".carry/pNN"]                  bash gpu/live_job.sh piece pNN        (p00 .. p26; the last one also
#       carries ".carry/extra")
#       then here: mv .aside/* . && rmdir .aside && git reset -q -- data notebooks figures
#                  (setup and run need data/: configs, prompts, jobs.json)
#  34   carry [".stage/run", ".carry/extra"]  bash gpu/live_job.sh setup
#  35   carry []                              LEFT=<lease budget_left_s> bash gpu/live_job.sh start
#  36.. carry []                              sleep 240; bash gpu/live_job.sh status      (each <= 600 s)
#       as soon as status says "part X done": bash gpu/live_job.sh pack X       (a, b, c, d; ≤ 8 files, 16 MiB)
#       the last call: bash gpu/live_job.sh pack all; then give_back.
# Nothing is carried after setup except .stage/run (its env.sh); /root/res, /root/cache survive while warm.
# Parts a and b run vLLM's default engine (async scheduling on for EAGLE): the plugin's async path is the least
# checked (its docstring's "GPU checks"). If `jobs lossless` shows a hybrid output differing from no SD at any batch
# size, rerun part b's hybrids with --engine-config study-like (synchronous: vLLM's list contract for drafts).
#
# SECOND SESSION (parts e-i of session.py, priced with the seconds the first session took; PREPARED, NOT YET RUN).
# The first showed vLLM 0.25's V1 runner fast only on uniform 1 + k decode batches; the hybrid's short n-gram drafts
# break them, so every draft is padded to k (hybrid.py, "Padding"). `bash gpu/live_job.sh plan --session 2` prints
# the plan and the parts that fit (it drops the lowest-priority ones until the total is under 1,650 s):
#   stage      calls  seconds  what
#   staging     34    254      measured: the first session's calls 1-33 (machine start, vllm c1..c7, p00..p26)
#   setup        1    255      measured
#   run   1 + polls   ~876     PARTS="e i f" (resumable, a marker per part; results in res/qwen2), the issue's
#                               Must show first:
#                               e ~406: no SD + pr24344-pad, pr24344-skip-pad, ngram-pad (code-edit, bs 1/8/32/64,
#                                       3 repeats), then lossless -> res/qwen2/lossless.jsonl
#                               i ~230: the idle hybrid (eagle-only: loaded, every request on EAGLE) vs EAGLE alone
#                               f ~240: EAGLE alone on vLLM's true default (its own runner: V2; untimed) and no SD
#                                       untimed (the step log's overhead beside e's timed no SD); lossless again
#   pack      1 per part  ~10
#   In all ~1,385 of 1,800. Dropped to fit (deferred): g, sharegpt for the best padded hybrid of e, EAGLE, no SD
#   (~350 s; `session run g` picks the hybrid from e's results); h, EAGLE drafting time at k = 1, 3, 8, 12 (~366 s).
#   With time left after f, `PARTS="e i f g"` runs g too (the deadline skips a part that cannot finish). Engine
#   names end in -s2 (distinct from the first session's).
# The calls: the same preparation here and the same calls 1-34 as above (staging, setup), then
#  35   carry []                              PARTS="e i f" LEFT=<lease budget_left_s> bash gpu/live_job.sh start
#  36.. carry []                              sleep 240; bash gpu/live_job.sh status      (each <= 600 s)
#       as soon as status says "part X done": bash gpu/live_job.sh pack X       (e, f, g: each packs res/qwen2 so far)
#       the last call: bash gpu/live_job.sh pack all; then give_back.
# Check padding in the step logs (steps_hybrid-default-*-pad-s2.jsonl): decode steps have batched_tokens ==
# num_reqs * (1 + k) and t_verify near the uniform steps' of the first session (pr24344: 1.98/2.07/2.45/3.21 ms at
# bs 1/8/32/64); `hybrid` has pad_tokens/pad_by/pad_accepted. Without PARTS, `start` runs the first session's a-d.
# THIRD SESSION (2026-12-01, RAN: 1,722 of 1,800 device s; results in data/gpu/reproduce/): `spec-repro reproduce --profile gpu` end to end (its grid: spec_repro/engines/
# vllm/gpu_profile.py), which holds the two open Must shows (the padded hybrids >= the best single proposer,
# the idle hybrid's overhead) in its first stage, then part n. Staged: Qwen 1.5B only (no 0.5B: no draft model this
# session), the head, code-edit + sharegpt, and the notebook stack's wheels (NB_WHEELS=1: papermill, jupytext,
# ipykernel and what the image lacks) in .carry/extra -> 19 pieces. Estimated device seconds (engines priced as the
# first session's analogues, MEASURED_S):
#   stage      calls  seconds  what
#   vllm         6    ~65      machine start + .stage/c1..c7
#   piece       19    ~100     .carry/p00..p18
#   setup        1    ~200     install vLLM + the notebook wheels, reassemble + verify the cache, convert the 1.5B
#   run   1 + polls   ~1,140   detached: reproduce --profile gpu --gpu-deadline (left): qwen ~530 (none 120,
#                               pr24344-pad 110, pr24344-skip-pad 78, eagle-only 110, eagle 110), traces ~200
#                               (vLLM decodes 24 code-edit + 24 sharegpt requests, n-gram + head profiled),
#                               llama ~270 (no SD + n-gram, default engine), tables ~20, notebooks ~120; then
#                               part n (ngram-pad, ~100) when 120 s are left
#   pack         3    ~40      rep (figures, summary, live tables, traces), raw step logs (split at 15 MB)
#   In all ~1,545 of 1,800 (~1,645 with part n).
#   Used: machine start ~100 (first call), vllm + 19 pieces 139, setup 193, run 1,160 (qwen 617: none 138,
#   pr24344-pad 173, pr24344-skip-pad 105, eagle-only 110, eagle 91; traces 114; llama 314: no SD 178, n-gram cut
#   by its deadline at 136 in its bs-256 repeats; tables 1; notebooks 89), part n failed to start (the timed-out
#   n-gram engine still held the GPU: run_specs now kills a spec's process group), polls and packs ~110.
# Here first: NB_WHEELS=1 WORKLOADS="code-edit sharegpt" HEADS=<sha> bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b
# Calls: vllm c1..c5, c6+c7; piece p00..p18 (carry [".carry/pNN"]); restore the tree; setup (carry [".stage/run",
# ".carry/extra"]); LEFT=<budget_left_s> bash gpu/live_job.sh start3; polls (sleep 190; status); pack r; give_back.
# FOURTH SESSION (2026-12-02; its results lost, run again: see below): the device-side hybrid (spec_repro/engines/vllm/gpu_hybrid.py: PR #24344's rule with
# no host round trip) and the idle hybrid's overhead, part k. This machine's cache came without the Qwen head (103 MB,
# never committed), so the run trains one first, shorter than issue 17's (no sharegpt-turns, 7,000 ShareGPT
# prompts, 512 new tokens, 520 s in all). Planned device seconds:
#   stage      calls  seconds  what
#   vllm         6    ~120     machine start + .stage/c1..c7
#   piece      ~18    ~95      .carry/pNN: Qwen 1.5B + code-edit, sharegpt, py-functions, py-write + the eval sets
#   setup        1    ~165     install vLLM, reassemble + verify the cache, convert the 1.5B, plugin entry point
#   run   1 + polls   ~1,100   detached (start4): train ~520; profile the committed no-SD outputs with the new head
#                               on the GPU ~60; part k ~540 (EAGLE, gpu-pr24344, idle, gpu-eagle-only, no SD, each
#                               ~107: code-edit, bs 1/8/32/64, k 5, 3 repeats), lossless
#   pack         2    ~30
#   In all ~1,510 of 1,800.
# Calls: vllm c1..c5, c6+c7; piece p00..pNN; restore the tree; setup (carry [".stage/run", ".carry/extra"]);
# LEFT=<budget_left_s> bash gpu/live_job.sh start4; polls (sleep 170; status k: each brings part k's results
# back); give_back. run4 is resumable (a head with TRAINING.json, done_p and finished engines are skipped):
# `bash gpu/live_job.sh stop` then start4 again restarts it where it was.
# USED (2026-12-02): machine start + vllm 73, 18 pieces 106, setup 186 (held 365 at its end); run: train 532 (9,569
# prompts decoded at ~20.8k tok/s, 726 optimizer steps, held-out walked tokens/step 1.55 / 2.02 / 2.20 at
# k = 1 / 3 / 5), profile (64 requests, ~0.1 s each), part k: EAGLE (finished), gpu-pr24344 89 (died at bs 32:
# the device buffer's rows of finished requests were never freed, vLLM tells them in a step without drafting;
# fixed, commit 808087f), idle 89, gpu-eagle-only 94, then (stopped and restarted, gpu-pr24344 first) gpu-pr24344 72, no SD 104, lossless. LOST: the
# machine went back before the pack call (a reply came later than the 30 s a machine stays warm), with every
# result on it; only the console tails the calls printed survived (CHANGELOG, "fourth GPU session"). Hence
# `status PART` (each poll brings the part's results back).
# THE FOURTH SESSION'S PLAN, RUN AGAIN (2026-12-02, issue 18's fourth GPU session): USED 1,685 of 1,800 device s: machine start + vllm c1..c7
# ~110, 18 pieces ~90, setup 179 (held 386 at its end), train 532 + profile ~15, part k 699 (EAGLE 147,
# gpu-pr24344 96, idle 103, no SD 102, gpu-eagle-only 120, n-gram 131), the head back in 7 pieces on the polls
# (no device time of its own). Results: data/gpu/live4/. What it showed: the same code in two engines (EAGLE alone
# and idle: vLLM's own EAGLE step either way) measured 0.99 / 0.75 / 1.11 / 1.15x at bs 1 / 8 / 32 / 64: the host
# phases (drafting, the rest) differ by up to 1.7 ms a step between engines and between repeats of one, in both
# directions, more than the effects to be measured (3%, 0.98x). Hence the FIFTH session's design:
# FIFTH SESSION (PREPARED, NOT YET RUN): parts m (code-edit) then s (sharegpt), session.py: ONE EAGLE engine
# rotating EAGLE alone ("off"), idle, gpu-pr24344, gpu-eagle-only between runs (jobs.rotated_spec: plugin op
# "hybrid", a Latin square over 4 repeats), beside no SD and vLLM's n-gram (4 repeats each). The head is the
# fourth session's (sha 2dce8ecc..., in this machine's cache since its pieces came back): no training. Estimated:
#   stage      calls  seconds  what
#   vllm         6    ~110     machine start + .stage/c1..c7
#   piece       19    ~110     Qwen 1.5B + the head + code-edit, sharegpt (p00..p18, staged 2026-12-02)
#   setup        1    ~180
#   run   1 + polls   ~1,200   detached (start5): part m ~600 (rotate ~320, none ~140, n-gram ~150), lossless;
#                               part s the same on sharegpt (the deadline cuts what does not fit)
#   In all ~1,600 of 1,800. Here first:
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt" HEADS=2dce8ecc35f50edfdf9290a5300d9b9eb53f93c2a83ae47a3f71f23c6ba8f87b \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b
# Calls: vllm c1..c5, c6+c7; piece p00..pNN (the last with .carry/extra); restore the tree; setup; LEFT=<budget_left_s>
# RESERVE=45 bash gpu/live_job.sh start5; polls `sleep 200; bash gpu/live_job.sh status m` (then `status s`), each
# reply's files copied here at once; give_back. Then `live summarize --raw DIR --out data/gpu/live5`, `live tables`.
# FIFTH SESSION, RUN with start6 (2026-12-02, issue 18's fifth GPU session; RAN: 1,727 of 1,800 device s; results in data/gpu/live5/): the fifth's plan on a machine
# whose cache held no head (the fourth's was lost with its checkout): start6 trains one first (run4's recipe).
# Planned: staging ~400, train ~535, profile ~15, part m ~610 (rotate ~320, none ~140, n-gram ~150), part s cut
# by the deadline -> ~1,560 + s. Used: machine start + vllm c1..c7 130, 18 pieces 129, setup 178 (held 437 at its
# end), run 1,280: train 530 (9,569 decodes, 642 optimizer steps; held-out walked tokens/step 1.53 / 1.96 / 2.11 at
# k = 1 / 3 / 5), profile 34, part m 553 (rotate 307 of which engine start 83, none 101, n-gram 140, lossless),
# part s ~160 (the rotated engine's bs 1 only; no SD and n-gram never started), the head back in 7 pieces on the
# polls (`status m 0-2`, `3-5`, `6-6`: 64 MiB a reply). Here first (the cache rebuilt on a new checkout):
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt py-functions py-write humaneval mt-bench gsm-symbolic" \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b          # 18 pieces, no head
# Calls: vllm c1..c5, c6+c7; piece p00..p17 (the last with .carry/extra); restore the tree; setup; LEFT=<budget_left_s>
# RESERVE=45 bash gpu/live_job.sh start6; polls `sleep 200-290; bash gpu/live_job.sh status m [A-B]`; give_back.
# SIXTH SESSION, RUN with start7 (2026-12-02; RAN: 1,554 of 1,800 device s; results in data/gpu/draftk/ and
# data/gpu/hostdrift/): part w, Deliver 5: EAGLE's drafting time at k = 1, 3, 5, 8, 12 on Qwen2.5-Coder-1.5B dims
# and Llama-3.1-8B dims, dummy weights, bs 1/8/32/64, 2 repeats + a warm-up (`plan --session 3`: ~1,155 s planned:
# vllm 130, setup7 110, run 915). Used: one refused start (91 s of budget, no machine), machine start + vllm c1..c7
# 209 (first call held 182), setup7 41 (held 258 at its end), run 10 engines in ~630 s (17:55-18:06 UTC), polls;
# then in the spare time one engine doing the same work 208 times (hostdrift, 68 + 225 s). The tree had to leave
# data/, notebooks/, figures/ aside for the vllm calls (tracked tree 40 MB + a 45 MB piece > 64 MiB).
# SEVENTH SESSION, RUN with start8 (2026-12-03; RAN: 1,786 of 1,800 device s incl. 181 s of refusals; results in
# data/gpu/live6/: training ~450 s, part s ~690 s with n-gram cut after bs 8; the sharegpt profile, part x and the
# code-edit profile did not fit). Its head is in this machine's cache (heads/ff44a72f...): stage it with HEADS=. Planned: part s (sharegpt: the rotated engine, no SD, n-gram) with a head
# trained in the run, then the sharegpt profile with that head (the predictor's input), then code-edit's if time
# is left. `PY=.venv/bin/python bash gpu/live_job.sh plan --session 4` prints it (~1,570 s of 1,800). Here first:
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt py-functions py-write humaneval mt-bench gsm-symbolic" \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b          # 18 pieces, no head
# Calls: `bash ../shared/gpu/prepare.sh`; move data/ notebooks/ figures/ aside; vllm c1..c5, c6+c7; piece
# p00..p17 (the last with .carry/extra); restore the tree; setup with carry [".stage/run", ".carry/extra"] (the
# conversion needs the gguf wheel: without it setup fails at exit 4); LEFT=<budget_left_s> RESERVE=45 bash
# gpu/live_job.sh start8; polls `sleep 240-290; bash gpu/live_job.sh status s [A-B]` (A-B: head pieces, 0-6);
# give_back. Then here: `python -m spec_repro.engines.vllm.live summarize --raw DIR --out data/gpu/live6` (copy
# hybrid_trace_sharegpt_s8.jsonl, head.sha256, head_TRAINING.json, host.txt in first) and device_hybrid_table on
# sharegpt (throughput(workload="sharegpt"); each run at its own host speed: ratio_host).
# EIGHTH SESSION, start9 (2026-12-03; RAN, results in data/gpu/live7/). Planned (`plan --session 5`): ~1,560 s of
# 1,800 at 4 repeats (staging ~450, part u ~440, part v ~440, the two profiles ~70, part z ~150 in the time left),
# ~1,364 s at the 3 repeats it ran with. Used: five refused starts and a machine lost between calls took ~815 s of
# budget; then staging 125, setup 142, the run from 710 s left: part u ~330 (its no SD 87) + its profile ~20, part
# v's rotated engine ~230, its no SD cut by the deadline, part z not run. The seventh session's head from the cache
# (no training). Parts u (code-edit) and v (sharegpt): ONE EAGLE engine rotating `off` (EAGLE alone), gpu-pr24344,
# eagle-only (the host-side machinery idle: the hybrid term the predictor fits for adaptive-rule) and adaptive-rule
# (the simulator's best causal policy, host-side, its drafts padded to k, priced with qwen2.5-coder-1.5b-h200),
# rotated over 3 repeats, beside no SD; each workload's no-SD outputs profiled with the head (GPU) after its part,
# then part z (vLLM's n-gram on code-edit). Here first:
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt" HEADS=ff44a72f312766fc393c0a850dddcf84d767e0a9074f7bb3d037fdd17800d87c \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b          # 19 pieces, the head included
# Calls: move data/ notebooks/ figures/ aside; vllm c1..c5, c6+c7; piece p00..p18 (the last with .carry/extra);
# restore the tree; setup (carry [".stage/run", ".carry/extra"]); LEFT=<budget_left_s> RESERVE=45 bash
# gpu/live_job.sh start9; polls `sleep 240; bash gpu/live_job.sh status u` (then `status v`: both pack qwen9);
# give_back. Then here: `python -m spec_repro.engines.vllm.live summarize --raw DIR --out data/gpu/live7`.
# NINTH SESSION, start10 (2026-12-03; RAN IN PART: results in data/gpu/live8/). USED 1,272 of 1,800 device s:
# the machine was lost three times between calls (a reply reached the session after the 30 s a machine stays warm):
# after vllm c1..c7 (131 s held), after piece p00 (120 s: a fresh start and one piece), then after the first poll
# with part y running (the second poll, 295 s, started a bare machine and found nothing); each fresh start ~115 s.
# Came back: part y's no SD on sharegpt (128 s, the machine's first engine), in the first poll's pack. Left 528 s:
# less than staging again (~460 s) plus one engine, so unused. The next session runs this plan again (start10,
# `plan --session 6`; part y again whole: its rotated engine and no SD on one machine), polling with `sleep 500`
# (fewer replies, fewer windows to lose a machine in). What the eighth left, which this plan covers: sharegpt's no
# SD beside its rotated engine (adaptive-rule on sharegpt against no SD and its prediction) and vLLM's n-gram alone
# (code-edit beside its no SD, sharegpt at every batch size). Planned (`plan --session 6`, priced with this
# session's measured no SD): ~1,389 s of 1,800: staging ~440 (machine start + vllm c1..c7 ~180, 19 pieces ~110,
# setup ~150); the run ~950: part y ~471 (no SD on sharegpt 128, the machine's first engine, then ONE EAGLE engine
# rotating off, gpu-pr24344, gpu-eagle-only (gpu-pr24344's hybrid term), eagle-only (adaptive-rule's) and
# adaptive-rule, 3 repeats ~333), sharegpt's no-SD profile ~35, part o ~443 (no SD 83 and n-gram 140 on code-edit,
# n-gram on sharegpt ~210). Here first:
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt" HEADS=ff44a72f312766fc393c0a850dddcf84d767e0a9074f7bb3d037fdd17800d87c \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b          # 19 pieces, the head included
# Calls: move data/ notebooks/ figures/ aside; vllm c1..c5, c6+c7; piece p00..p18 (the last with .carry/extra);
# restore the tree; setup (carry [".stage/run", ".carry/extra"]); LEFT=<budget_left_s> RESERVE=50 bash
# gpu/live_job.sh start10; polls `sleep 500; bash gpu/live_job.sh status y` (then `status o`: both pack qwen10);
# give_back. Then here: `python -m spec_repro.engines.vllm.live summarize --raw DIR --out data/gpu/live8`.
# TENTH SESSION, start10 again (2026-12-03 17:00-17:35 UTC; RAN WHOLE: results in data/gpu/live9/). USED 1,642 of
# 1,800 device s: the machine was lost once, after piece p08 (a reply past the 30 s), so vllm c1..c7 and p00..p08
# were carried again on a fresh start (~117 s lost); then setup 165 s, start10 with 1,140 s left, two polls
# (`sleep 500; status y`, `sleep 455; status o`), give_back. The run: part y 448 s (no SD on sharegpt 121, the
# rotated engine 327), the no-SD outputs profiled on the H200 (~10 s: 0.1-0.2 s a request), part o 343 s
# (no SD 81, n-gram 140 on code-edit, n-gram on sharegpt 122). MEASURED_S holds these for the next plans.
# ELEVENTH SESSION, start11 (PREPARED, NOT YET RUN): `plan --session 7`, ~1,403 s of 1,800. What the tenth left:
# gpu-pr24344 measured 11% / 19% over its prediction at bs 32 / 64 on sharegpt (data/gpu/live9/README.md: the
# t_other host index read one policy's t_other as the host's speed). Every run now records the worker's own host
# probe before and after it (`VLLMEngine.engine_probe`, runs.csv's engine_probe_ms / engine_probe_end_ms), a
# reading no policy's work enters. Part l: code-edit's no SD, then the five-policy rotated engine (gpu-eagle-only
# beside adaptive-rule on code-edit for the first time: both hybrids with their own terms); part q: part y again on
# sharegpt. Afterwards, here: does the probe track a run's drafting time within a policy (data/gpu/hostdrift's
# test), and does an index from it hold gpu-pr24344 within 10% where t_other's did not, without losing the others
# (live5-live9)? Calls as the tenth session's (staging ~490 s, then `LEFT=<budget_left_s> RESERVE=50 bash
# gpu/live_job.sh start11`, polls `sleep 480; status l`, then `status q`: both pack qwen11). Then
# `python -m spec_repro.engines.vllm.live summarize --raw DIR --out data/gpu/live10`.
# TWELFTH SESSION, start12 (PREPARED, NOT YET RUN): `plan --session 8`, ~1,505 s of 1,800. The checkout is new and
# no cache keeps the seventh session's head (ff44a72f...), so the run trains one first (start8's recipe, ~530 s,
# into qwen11/head), then part q (sharegpt, where live9's gpu-pr24344 missed: no SD, then the five-policy rotated
# engine, the engine probe around every run) and its profile with the new head, then part l and its profile only
# in the time left. Here first:
#   PATH=/work/main/.venv/bin:$PATH WORKLOADS="code-edit sharegpt py-functions py-write humaneval mt-bench gsm-symbolic" \
#     bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b          # 18 pieces, no head
# Calls as the tenth session's with p00..p17 (the last with .carry/extra), then `LEFT=<budget_left_s> RESERVE=50
# bash gpu/live_job.sh start12`; polls `sleep 480; bash gpu/live_job.sh status q` (then `status l`: both pack qwen11).
# TWELFTH SESSION, start12 (2026-12-04 02:00-02:22 UTC; RAN part q whole: results in data/gpu/live10/). The lease
# gave 1,500 device s, not 1,800: `plan --session 9 --budget 1450` (~1,435 s) prices the training at 450 s; staging
# went faster than priced, so it ran at TRAIN_BUDGET=500. USED 1,377 of 1,500: machine start + vllm c1..c7 ~100 (the
# first call held 74), 18 pieces ~70 (~3.5 s a call), setup 170 (held 345 at its end), `TRAIN_BUDGET=500 LEFT=1145
# RESERVE=45 bash gpu/live_job.sh start12`, two polls (`sleep 545; status q`, `sleep 455; status q`), give_back. The
# run: train 501 (800 optimizer steps; held-out walked tokens/step 2.07 / 2.24 at k = 3 / 5), part q 432 (no SD 95,
# the rotated engine 337), the profile ~10; part l not started (81 s left). Summarized here at once:
# `python -m spec_repro.engines.vllm.live summarize --raw /work/res12 --out data/gpu/live10`. Left for a later session:
# part l (code-edit's five-policy engine: gpu-eagle-only beside adaptive-rule there) and the adaptive rule on the device.
set -u
export SPEC_REPRO_CACHE=/root/cache PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1
R=${RES:-/root/res}; Q=qwen2.5-coder-1.5b; QD=qwen2.5-coder-0.5b
HEAD=/root/cache/heads/${HEAD_SHA:-6a8986521a4253cc1bc5e12812989cf7f59fd27b1a010b549a637b3e37ca1a44}
# the seventh GPU session's head, staged from the cache (run9, run10, run11; HEAD9 / HEAD10 / HEAD11 override)
HEAD7=/root/cache/heads/ff44a72f312766fc393c0a850dddcf84d767e0a9074f7bb3d037fdd17800d87c
PY=${PY:-python3}
ses() { $PY -m spec_repro.engines.vllm.session "$@"; }
mdir() { $PY -c "from spec_repro import models; print(models.converted_dir('$1'))"; }
left() { echo $(( END - $(date +%s) )); }   # seconds to this session's run deadline (END: set by start / run)
pdir() { case $1 in a|b) echo qwen ;; c) echo llama8b ;; d) echo draftk ;; e|f|g|i) echo qwen2 ;; h) echo draftk2 ;;
         r) echo rep ;; j|n) echo rep/gpu/raw/qwen2 ;; k|t|p) echo qwen4 ;; x) echo qwen6 ;; m|s) [ -d $R/qwen6 ] && echo qwen6 || echo qwen5 ;; w) echo draftk6 ;;
         u|v|z) echo qwen9 ;; y|o) echo qwen10 ;; l|q) echo qwen11 ;;
         *) echo "unknown part $1" >&2; return 1 ;; esac; }   # a part's results folder under $R
detach() {  # detach RUNCASE: that case of this script in its own session (survives between calls); LEFT=S: the
            # lease's budget_left_s now (the deadline: LEFT - RESERVE from now)
  mkdir -p $R
  END=$(( $(date +%s) + ${LEFT:-1150} - ${RESERVE:-60} ))
  echo $END > $R/end_epoch
  setsid nohup env END=$END bash gpu/live_job.sh $1 > $R/pipeline.log 2>&1 < /dev/null &
  sleep 2; echo "started; deadline in $(( END - $(date +%s) )) s"
}
part() {  # part NAME: its engines (resumable), then its post-steps; a marker when all of it finished
  local p=$1 out=$R/$2 rc
  [ -f $R/done_$p ] && { echo "part $p done before"; return 0; }
  [ $(left) -lt 120 ] && { echo "part $p not started: $(left) s left"; return 0; }
  ses run $p --out $out --deadline $(left) --head $HEAD --model-dir $(mdir $Q) --draft-dir $(mdir $QD) \
    > $R/log_$p.txt 2>&1; rc=$?
  case $p in
    a) ses predict --out $out --head $HEAD >> $R/log_$p.txt 2>&1 && ses agreement --out $out >> $R/log_$p.txt 2>&1
       rc=$(( rc + $? )) ;;
    b|e|f|g|k|m|s|x|u|v|z|y|o|l|q) $PY -m spec_repro.engines.vllm.jobs lossless --out $out > $out/lossless.jsonl 2>> $R/log_$p.txt
       rc=$(( rc + $? )) ;;
  esac
  echo "part $p rc=$rc" >> $R/log_$p.txt
  # a part that ran out of time is not marked: `start` again (next session) resumes its unfinished engines
  [ $rc = 0 ] && ! grep -q 'not started' $R/log_$p.txt && touch $R/done_$p
}
train_head() {  # train_head DIR: an EAGLE head for Qwen 1.5B (the fourth session's recipe; skipped when DIR has one)
  [ -f $1/TRAINING.json ] && return 0
  $PY -m spec_repro.cli train eagle --engine vllm --target $Q --out $1 --workloads ${TRAIN_WL:-sharegpt py-functions py-write} \
    --train-n ${TRAIN_N:-7000} --val-n 64 --max-new-tokens ${TRAIN_NEW:-512} --steps 100000 \
    --time-budget ${TRAIN_BUDGET:-520} --lr ${LR:-8e-4} --tokens-per-batch 16384 --ttt-depth 5 --depth-decay 1.0 \
    --device cuda > $R/log_t.txt 2>&1
  echo "train rc=$?" >> $R/log_t.txt
}
host_txt() {  # host_txt DIR: the host now (CPU, its clocks, the GPU's clocks and state) into DIR/host.txt
  { lscpu; grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head -5; nvidia-smi -q -d CLOCK,PERFORMANCE; } \
    > $1/host.txt 2>&1
}
new_head() {  # new_head DIR: the host into DIR/host.txt, then a head trained into DIR/head (train_head), its sha256
             # and TRAINING.json beside; rc 1 when no head came out
  mkdir -p $1; host_txt $1
  train_head $1/head
  [ -f $1/head/TRAINING.json ] || return 1
  touch $R/done_t
  sha256sum $1/head/model.safetensors > $1/head.sha256
  cp $1/head/TRAINING.json $1/head_TRAINING.json; cp $1/head/config.json $1/head_config.json
}
head_into() {  # head_into DIR: the staged head $HEAD checked, its sha256, TRAINING.json, config.json and the host
               # into DIR; rc 1 when no head is staged
  [ -f $HEAD/model.safetensors ] || { echo "no head $HEAD: stage it (HEADS=)"; return 1; }
  mkdir -p $1
  sha256sum $HEAD/model.safetensors > $1/head.sha256
  cp $HEAD/TRAINING.json $1/head_TRAINING.json; cp $HEAD/config.json $1/head_config.json
  host_txt $1 || true       # the host's description: best effort (no nvidia-smi on a CPU machine)
}
profile_sharegpt() {  # profile_sharegpt DIR OUT: part s's no-SD sharegpt outputs (DIR's runs) profiled with DIR/head
                      # (the predictor's input); once (done_q)
  [ $(left) -gt 20 ] && [ ! -f $R/done_q ] || return 0
  $PY -m spec_repro.engines.vllm.live profile --raw $1 --workload sharegpt --head $1/head --device cuda --out $2 \
    > $R/log_q.txt 2>&1 && touch $R/done_q
  echo "profile rc=$?" >> $R/log_q.txt
}
profile_committed() {  # profile_committed HEAD OUT: the committed code-edit no-SD outputs (first live session)
                       # profiled with HEAD on the GPU (the predictor's input); once (done_p)
  [ -f $R/done_p ] && return 0
  $PY -m spec_repro.engines.vllm.live profile --trace data/gpu/live/hybrid_trace.jsonl --head $1 --device cuda \
    --out $2 > $R/log_p.txt 2>&1 && touch $R/done_p
  echo "profile rc=$?" >> $R/log_p.txt
}
profile_raw() {  # profile_raw WORKLOAD HEAD OUT: this run's no-SD outputs of WORKLOAD (bs 64, repeat 0, in OUT's
                 # folder) profiled with HEAD on the GPU (the predictor's input); once per workload (done_p_WORKLOAD)
  [ $(left) -gt 60 ] && [ ! -f $R/done_p_$1 ] || return 0
  $PY -m spec_repro.engines.vllm.live profile --raw $(dirname $3) --workload $1 --head $2 --device cuda --out $3 \
    > $R/log_p_$1.txt 2>&1 && touch $R/done_p_$1
  echo "profile rc=$?" >> $R/log_p_$1.txt
}
case "$1" in
  plan)       # CPU, no vLLM: the stages, engines, seconds and total; rc 1 when over the plan limit
    ses plan "${@:2}" ;;        # here: PY=/work/main/.venv/bin/python bash gpu/live_job.sh plan
  vllm)       # vllm cN [cM]: pieces of the vLLM wheel (../shared/gpu/prepare.sh), as traces_job.sh stages them
    for c in "${@:2}"; do bash gpu/traces_job.sh vllm $c || exit 1; done ;;
  piece)      # a piece of gpu/stage_cache.sh's stream
    bash gpu/traces_job.sh piece $2 ;;
  setup)
    bash .stage/run/install.sh || exit 2
    bash gpu/device.sh cache || exit 3
    bash gpu/device.sh setup                                  # the plugin's entry point (hybrid + step logs)
    mkdir -p $R
    for m in $Q $QD; do
      [ -d /root/cache/models/$m ] || { echo "$m not staged: not converted"; continue; }
      $PY -c "from spec_repro import models; models.convert('$m')" > $R/log_convert_$m.txt 2>&1 \
        || { tail -n 5 $R/log_convert_$m.txt; exit 4; }
    done
    tail -n 2 $R/log_convert_*.txt; ls /root/cache/models/*/ $HEAD ;;
  start)      # the run, detached (setsid): survives between calls. LEFT=S: the lease's budget_left_s now; PARTS="e i f":
              # those parts (inherited by the detached run), unset: a-d
    detach run ;;   # RESERVE (default 60 s): the last pack call + margin
  run)       # in the foreground (start runs it detached); END: epoch seconds of the deadline (default 1,100 s on)
    # PARTS="e i f": those parts in that order (the second session's: `plan --session 2`); unset: the first's a-d
    END=${END:-$(( $(date +%s) + 1100 ))}
    if [ -z "${PARTS:-}" ]; then
      mkdir -p $R/qwen $R/llama8b $R/draftk
      part a qwen; part b qwen; part c llama8b; part d draftk
    else
      for p in $PARTS; do d=$(pdir $p) || exit 2; mkdir -p $R/$d; part $p $d; done
    fi
    echo PIPE_FINISHED ;;
  start3)     # the third session: `spec-repro reproduce --profile gpu` (its grid, then the notebooks), then part n
              # with the time left. LEFT=S: the lease's budget_left_s now
    detach run3 ;;
  run3)
    END=${END:-$(( $(date +%s) + 1100 ))}
    $PY -m spec_repro.cli reproduce --profile gpu --out $R/rep --head $HEAD --gpu-deadline $(left) \
      > $R/log_r.txt 2>&1; echo "reproduce rc=$?" >> $R/log_r.txt
    touch $R/done_r
    part n $(pdir n)
    echo PIPE_FINISHED ;;
  start4)     # the fourth session: train a head (the cache holds none), profile the committed outputs with it,
              # then part k (the device-side hybrid). LEFT=S: the lease's budget_left_s now
    detach run4 ;;
  run4)
    END=${END:-$(( $(date +%s) + 1100 ))}
    mkdir -p $R/qwen4; H4=$R/qwen4/head
    train_head $H4
    [ -f $H4/TRAINING.json ] && touch $R/done_t || { echo "no head: stop"; echo PIPE_FINISHED; exit 3; }
    sha256sum $H4/model.safetensors > $R/qwen4/head.sha256
    profile_committed $H4 $R/qwen4/hybrid_trace_s4.jsonl
    HEAD=$H4 part k qwen4
    echo PIPE_FINISHED ;;
  start6)     # the fifth session's parts m, s run on a machine whose cache holds no head (none survived): train
              # one first (run4's recipe), profile the committed code-edit outputs with it, then m (code-edit) and s
              # (sharegpt; the deadline cuts what does not fit), then sharegpt's no-SD outputs profiled with the head.
              # LEFT=S: the lease's budget_left_s now
    detach run6 ;;
  run6)
    END=${END:-$(( $(date +%s) + 1100 ))}
    H5=$R/qwen5/head
    new_head $R/qwen5 || { echo "no head: stop"; echo PIPE_FINISHED; exit 3; }
    profile_committed $H5 $R/qwen5/hybrid_trace_s5.jsonl
    for p in ${PARTS:-m s}; do HEAD=$H5 part $p qwen5; done
    profile_sharegpt $R/qwen5 $R/qwen5/hybrid_trace_sharegpt_s5.jsonl
    echo PIPE_FINISHED ;;
  start8)     # the seventh session (`plan --session 4`): a head trained in the run, part s (sharegpt: the rotated
              # engine, no SD, n-gram) into qwen6, the sharegpt profile, then part x (adaptive-rule's first live
              # run) and code-edit's profile if time is left.
              # LEFT=S: the lease's budget_left_s now
    detach run8 ;;
  run8)
    END=${END:-$(( $(date +%s) + 1100 ))}
    H6=$R/qwen6/head
    new_head $R/qwen6 || { echo "no head: stop"; echo PIPE_FINISHED; exit 3; }
    for p in ${PARTS:-s}; do HEAD=$H6 part $p qwen6; done
    profile_sharegpt $R/qwen6 $R/qwen6/hybrid_trace_sharegpt_s8.jsonl
    [ $(left) -gt 150 ] && HEAD=$H6 part x qwen6      # adaptive-rule's first live run, in the time left (~115 s)
    [ $(left) -gt 60 ] && profile_committed $H6 $R/qwen6/hybrid_trace_s8.jsonl
    echo PIPE_FINISHED ;;
  start9)     # the eighth session (`plan --session 5`): the seventh session's head from the cache (HEADS=ff44a72f...),
              # parts u (code-edit) and v (sharegpt): ONE EAGLE engine rotating EAGLE alone, gpu-pr24344, the host
              # machinery idle (eagle-only) and adaptive-rule (host-side, padded), beside no SD; both workloads'
              # no-SD outputs profiled with the head; part z (n-gram, code-edit) in the time left.
              # LEFT=S: the lease's budget_left_s now
    detach run9 ;;
  run9)
    END=${END:-$(( $(date +%s) + 1100 ))}
    HEAD=${HEAD9:-$HEAD7}
    D=$R/qwen9; head_into $D || { echo PIPE_FINISHED; exit 3; }
    part u qwen9                                               # each workload's profile right after its part
    profile_raw code-edit $HEAD $D/hybrid_trace_s9.jsonl
    part v qwen9
    profile_raw sharegpt $HEAD $D/hybrid_trace_sharegpt_s9.jsonl
    [ $(left) -gt 170 ] && part z qwen9      # n-gram alone on code-edit, in the time left (~140 s)
    echo PIPE_FINISHED ;;
  start10)    # the ninth session (`plan --session 6`): the seventh session's head from the cache (HEADS=ff44a72f...),
              # part y (sharegpt: no SD, then ONE EAGLE engine rotating EAGLE alone, gpu-pr24344, gpu-eagle-only,
              # eagle-only, adaptive-rule), sharegpt's no-SD outputs profiled with the head, then part o (n-gram
              # beside no SD on code-edit, n-gram on sharegpt). LEFT=S: the lease's budget_left_s now
    detach run10 ;;
  run10)
    END=${END:-$(( $(date +%s) + 1100 ))}
    HEAD=${HEAD10:-$HEAD7}
    D=$R/qwen10; head_into $D || { echo PIPE_FINISHED; exit 3; }
    part y qwen10
    profile_raw sharegpt $HEAD $D/hybrid_trace_sharegpt_s10.jsonl
    part o qwen10
    echo PIPE_FINISHED ;;
  start11)    # the eleventh session (`plan --session 7`): the seventh session's head from the cache (HEADS=ff44a72f...),
              # part l (code-edit: no SD, then ONE EAGLE engine rotating EAGLE alone, gpu-pr24344, gpu-eagle-only,
              # eagle-only, adaptive-rule), its no-SD outputs profiled, then part q (the same on sharegpt) and its
              # profile; every run with the worker's host probe before and after. LEFT=S: the lease's budget_left_s now
    detach run11 ;;
  run11)
    END=${END:-$(( $(date +%s) + 1100 ))}
    HEAD=${HEAD11:-$HEAD7}
    D=$R/qwen11; head_into $D || { echo PIPE_FINISHED; exit 3; }
    part l qwen11
    profile_raw code-edit $HEAD $D/hybrid_trace_s11.jsonl
    part q qwen11
    profile_raw sharegpt $HEAD $D/hybrid_trace_sharegpt_s11.jsonl
    echo PIPE_FINISHED ;;
  start12)    # the twelfth session (`plan --session 8`): start11's parts on a machine whose cache holds no head
              # (a new checkout: ff44a72f... is gone): a head trained in the run first (start8's recipe, into
              # qwen11/head), then part q (sharegpt: live9's miss) and its profile, then part l and its profile in
              # the time left (the deadline cuts what does not fit). LEFT=S: the lease's budget_left_s now
    detach run12 ;;
  run12)
    END=${END:-$(( $(date +%s) + 1100 ))}
    D=$R/qwen11; HEAD=$D/head
    new_head $D || { echo "no head: stop"; echo PIPE_FINISHED; exit 3; }
    part q qwen11
    profile_raw sharegpt $HEAD $D/hybrid_trace_sharegpt_s11.jsonl
    [ $(left) -gt 200 ] && { part l qwen11; profile_raw code-edit $HEAD $D/hybrid_trace_s11.jsonl; }
    echo PIPE_FINISHED ;;
  setup7)     # the sixth session's setup: vLLM and the plugin only (part w runs dummy weights: no cache, no model)
    bash .stage/run/install.sh || exit 2
    bash gpu/device.sh setup ;;
  start7)     # the sixth session: part w, EAGLE's drafting time at k = 1, 3, 5, 8, 12 for Qwen and Llama-3.1-8B dims
              # (dummy weights; `plan --session 3`). LEFT=S: the lease's budget_left_s now
    detach run7 ;;
  run7)
    END=${END:-$(( $(date +%s) + 1100 ))}
    mkdir -p $R/draftk6
    host_txt $R/draftk6
    if [ ! -f $R/done_w ]; then    # resumable: run_specs skips the engines that finished
      ses run w --out $R/draftk6 --deadline $(left) --head none --model-dir none --draft-dir none > $R/log_w.txt 2>&1
      rc=$?; echo "part w rc=$rc" >> $R/log_w.txt
      [ $rc = 0 ] && ! grep -q 'not started' $R/log_w.txt && touch $R/done_w
    fi
    echo PIPE_FINISHED ;;
  start5)     # the fifth session: parts m (code-edit) then s (sharegpt): ONE EAGLE engine rotating EAGLE alone,
              # idle and the device-side hybrids, beside no SD and n-gram; the fourth session's head, staged from
              # the cache (HEADS=2dce8ecc...). LEFT=S: the lease's budget_left_s now
    detach run5 ;;
  run5)
    END=${END:-$(( $(date +%s) + 1100 ))}
    HEAD=/root/cache/heads/${HEAD5:-2dce8ecc35f50edfdf9290a5300d9b9eb53f93c2a83ae47a3f71f23c6ba8f87b}
    [ -f $HEAD/model.safetensors ] || { echo "no head $HEAD: stage it (HEADS=)"; echo PIPE_FINISHED; exit 3; }
    mkdir -p $R/qwen5; sha256sum $HEAD/model.safetensors > $R/qwen5/head.sha256
    # the host, for the step-time spread the fifth session found (host phases bimodal between repeats)
    host_txt $R/qwen5
    for p in ${PARTS:-m s}; do part $p qwen5; done
    echo PIPE_FINISHED ;;
  stop)       # the detached pipeline and every engine it started (a run that must restart in another order)
    pkill -f "live_job.sh run"; pkill -f "spec_repro.engines.vllm"; sleep 3
    pkill -9 -f "spec_repro.engines.vllm"; pkill -9 -f EngineCore; sleep 2
    nvidia-smi --query-gpu=memory.used --format=csv,noheader ;;
  status)     # status [PART [A-B]]: the logs' tails; with PART also that part's results so far into $OUT (every poll
              # brings them back: a machine lost between calls loses at most what ran since the last poll)
    [ -n "${2:-}" ] && bash gpu/live_job.sh pack $2 > /dev/null
    [ -n "${3:-}" ] && bash gpu/live_job.sh headback $3 > /dev/null     # status k 0-2: also head pieces 0..2
    for f in $R/pipeline.log $R/log_[a-z].txt $R/log_p_*.txt; do
      [ -f $f ] && { echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v -E '^\s*$|^(INFO|DEBUG)' | tail -n 5; }
    done
    ls $R/done_* 2>/dev/null | sed 's|.*/done_|part done: |'
    [ -f $R/end_epoch ] && echo "deadline in $(( $(cat $R/end_epoch) - $(date +%s) )) s"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
  pack)       # pack a|...|i|all: that part's results folder (pdir) as one file
    case $2 in [a-z]) d=$(pdir $2) ;; *) d=. ;; esac
    tar czf $OUT/res_$2.tgz -C $R --exclude='*.lock' --exclude='model.safetensors' --exclude='*.pt' $d $([ $d = . ] || (cd $R && ls log_*.txt pipeline.log 2>/dev/null))
    if [ $(stat -c %s $OUT/res_$2.tgz) -ge 15000000 ]; then     # a call brings back files of 16 MiB at most
      split -b 15M -d -a 1 $OUT/res_$2.tgz $OUT/res_$2.tgz.part && rm $OUT/res_$2.tgz; fi
    ls -la $OUT ;;
  headback)   # headback A-B: pieces A..B (15 MiB each, 0-6) of the head run4 trained, into $OUT; here (this
              # machine's cache keeps it for the next session: saves the ~530 s retraining):
              #   cat head.tar.part* | tar xf - -C /tmp/h && mv /tmp/h/head ~/.cache/spec_repro/heads/<sha256>
    H4=$R/qwen4/head; [ -f $R/qwen5/head/TRAINING.json ] && H4=$R/qwen5/head     # run8's, else run6's, else run4's
    [ -f $R/qwen6/head/TRAINING.json ] && H4=$R/qwen6/head
    [ -f $H4/TRAINING.json ] || { echo "no head yet"; exit 0; }
    mkdir -p $R/headparts
    [ -f $R/headparts/done ] || { tar cf - -C $(dirname $H4) head | split -b 15M -d -a 1 - $R/headparts/head.tar.part \
      && touch $R/headparts/done; }
    for i in $(seq ${2%-*} ${2#*-}); do [ -f $R/headparts/head.tar.part$i ] && cp $R/headparts/head.tar.part$i $OUT/; done
    ls -la $OUT ;;
  send)       # send FILE: a part of a split pack (split -b 15M $OUT/... first)
    cp $R/$2 $OUT/ && ls -la $OUT ;;
  *) echo "stages: plan vllm piece setup setup7 start run start3 run3 start4 run4 start5 run5 start6 run6 start7 run7 start8 run8 start9 run9 start10 run10 start11 run11 start12 run12 stop status pack headback send"; exit 2 ;;
esac
