"""Offline probe for a next step (twelfth session; not a product change): would a tail that counts once its evidence
is significant act sooner than the committed rule (the share counts once its stretch is `tail_tau_s` old)?

Run from the repository root: `.venv/bin/python docs/benchmarks/harness-h200-2026-11-30/s12/tail_significance_probe.py`.
It replays the 14 governor-off phases of the s12 A/B (unthrottled daemon, model on the GPU: valid open loop up to the
governor's first action) through the governor twice, `_tail_over` as committed and replaced by a binomial test (at
least 3 slow samples, P(X >= slow | n, tail_max_share) <= 0.01 on the EWMA's rounded counts), and prints when the first
tighten comes and how many frames over 115 % of target came before it (from 4 s, the first replies). Result at
88697e5: 92 slow frames before the first tighten in all 14 phases as committed, 77 with the test alone, 48 with
either rule (the earlier of the two per phase); the test alone is later where slow samples are sparse.
"""
import gzip, json, math, sys, glob
sys.path.insert(0, '.')
import igi_sdk.policy.governor as G
from igi_sdk.policy.governor import FrameSample, Governor
T = 1000/60
orig = G._tail_over
def binom_sf(x, n, p):
    return sum(math.comb(n, k) * p**k * (1-p)**(n-k) for k in range(x, n+1))
def sig_over(state, sample, params, alpha=0.01, kmin=3):
    on_gpu = sample.daemon_gpu_mib is not None and sample.daemon_gpu_mib > 0.0
    if not (sample.generating and on_gpu and state.tail_since_s is not None): return False
    n = round(state.tail_weight); x = round(state.tail_slow_weight)
    if x < kmin or n == 0: return False
    return state.tail_share() >= params.tail_max_share and binom_sf(x, n, params.tail_max_share) <= alpha
def first_tail(ph, rule):
    G._tail_over = rule
    f = ph['frame_timeline']; g = Governor(budget_mib=2048); worst = 0
    for i, t in enumerate(f['t_s']):
        worst = max(worst, f['busy_ms'][i])
        if (i+1) % 6: continue
        d = g.observe(FrameSample(now_s=t, frame_time_ms=worst, target_frame_time_ms=T, generating=f['npcs_generating'][i] > 0, daemon_gpu_mib=1159.1))
        worst = 0
        if d.throttle_action == 'tighten': return t
    return None
totals = [0, 0, 0]
for path in sorted(glob.glob('docs/benchmarks/harness-h200-2026-11-30/s12/reports/*.gz')):
    r = json.load(gzip.open(path))
    for ph in r['phases']:
        if ph['governor']: continue  # the unthrottled streams: valid open loop until the first action
        f = ph['frame_timeline']
        a, b = first_tail(ph, orig), first_tail(ph, sig_over)
        slow_before = lambda t: sum(1 for tt, x in zip(f['t_s'], f['interval_ms']) if 4 <= tt < (t or 99) and x > 1.15*T)
        either = min(t for t in (a, b, 99.0) if t is not None)
        counts = [slow_before(a), slow_before(b), slow_before(either)]
        totals = [x + y for x, y in zip(totals, counts)]
        print(path.split('/')[-1].split('.')[0], f"first tighten: committed {a} ({counts[0]} slow before) | "
              f"significance {b} ({counts[1]}) | either {either} ({counts[2]})")
G._tail_over = orig
print("slow frames before the first tighten, all phases: committed %d, significance %d, either %d" % tuple(totals))
