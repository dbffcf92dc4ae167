#!/usr/bin/env bash
# The step model of `bench --dry-run` (bench/step_model.c) against the arithmetic of the
# llama-tiny recipe written out here from its shape (dim 128, MLP 352, 2 layers, 4/2 heads of
# 32, vocab 256; LoRA r16 on all seven projections of a 4-bit base; checkpointing):
#  - GEMM: the base projections forward, again when backward recomputes a layer (every layer
#    but the last, whose forward activations are still there), and for the input gradient;
#    the head forward and its input gradient (frozen: no weight gradient); each adapter's two
#    products forward (and recomputed) and four backward;
#  - attention: per layer call 4*B*Hq*D*T(T+1)/2 forward (causal), 10*... backward (the
#    score gradients kept in du, lent: its 512 x 352 floats hold dS's 8 pairs of 2 heads, 3
#    tiles each), 14*... with TZ_FA_DS=0 (a GPU's flash kernels compute S and dP twice); the
#    forward once a layer (a GPU's recomputation reads the outputs kept from it), or again
#    for every layer but the last with TZ_ATT_KEEP=0;
# at seq_len 128 and 64 and micro-batch 4 and 2, to 1e-5 (the table's six digits). A DiT
# preset prints its table too.
# usage: step_model_test.sh TURBOZERO
set -u
tz=$1
source "$(dirname "$0")/../lib.sh"
for args in "" "--set data.seq_len=64" "--set train.micro_batch=2" "--set train.grad_accum=3" \
            "TZ_ATT_KEEP=0" "TZ_FA_DS=0"; do
  K=1 S=1
  if [ "$args" = TZ_ATT_KEEP=0 ]; then
    K=0
    out=$(TZ_ATT_KEEP=0 "$tz" bench --preset llama-tiny --dry-run 2>&1)
  elif [ "$args" = TZ_FA_DS=0 ]; then
    S=0
    out=$(TZ_FA_DS=0 "$tz" bench --preset llama-tiny --dry-run 2>&1)
  else
    out=$("$tz" bench --preset llama-tiny --dry-run $args 2>&1)
  fi
  T=128 B=4 A=1
  [[ "$args" == *seq_len=64* ]] && T=64
  [[ "$args" == *micro_batch=2* ]] && B=2
  [[ "$args" == *grad_accum=3* ]] && A=3
  got_gemm=$(awk '$1 == "GEMM" {print $3}' <<< "$out")
  got_att=$(awk '$1 == "attention" {print $3}' <<< "$out")
  read -r want_gemm want_att < <(/usr/bin/python3 - $T $B $A $K $S <<'PY'
import sys
T, B, A, K, S = map(int, sys.argv[1:])
C, F, L, Hq, Hkv, D, V, r = 128, 352, 2, 4, 2, 32, 256, 16
n, qd, kvd = B * T, Hq * D, Hkv * D
layer = 2 * n * (C * qd + 2 * C * kvd + qd * C + 3 * C * F)             # q, k, v, o, gate, up, down
head = 2 * n * C * V
lora = 2 * n * r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + F) + (F + C))
gemm = layer * (3 * L - 1) + 2 * head + lora * (4 * L - 1)
att_f = 4 * B * Hq * D * T * (T + 1) / 2
att = att_f * (L if K else 2 * L - 1) + (2.5 if S else 3.5) * att_f * L
print("%.6g %.6g" % (A * gemm / 1e9, A * att / 1e9))
PY
)
  if [ -n "$got_gemm" ] && awk -v a="$got_gemm" -v b="$want_gemm" -v c="$got_att" -v d="$want_att" \
       'BEGIN { e1 = (a - b) / b; e2 = (c - d) / d; exit !(e1 < 1e-5 && e1 > -1e-5 && e2 < 1e-5 && e2 > -1e-5) }'; then
    ok "llama-tiny ${args:-(the recipe)}: GEMM $got_gemm GFLOP, attention $got_att GFLOP, as the arithmetic of the shape"
  else
    bad "llama-tiny ${args:-(the recipe)}: GEMM $got_gemm (want $want_gemm), attention $got_att (want $want_att)"
    grep -A10 "step model" <<< "$out"
  fi
done
# TZ_STEP_OPS=1: the table by op, whose rows add up to the classes' total (GB and ms)
out=$(TZ_STEP_OPS=1 "$tz" bench --preset llama-tiny --dry-run 2>&1)
read -r tot_gb tot_ms < <(awk '$1 == "total" {print $(NF-1), $NF}' <<< "$out")
read -r sum_gb sum_ms nops < <(awk 'f && NF >= 6 {g += $(NF-1); t += $NF; n++} /op \(counter\)/ {f = 1}
                                    END {printf "%.9g %.9g %d\n", g, t, n}' <<< "$out")
if [ -n "$tot_gb" ] && [ "${nops:-0}" -ge 10 ] && awk -v a="$sum_gb" -v b="$tot_gb" -v c="$sum_ms" -v d="$tot_ms" \
     'BEGIN { e1 = (a - b) / b; e2 = (c - d) / d; exit !(e1 < 1e-3 && e1 > -1e-3 && e2 < 1e-3 && e2 > -1e-3) }'; then
  ok "llama-tiny, TZ_STEP_OPS=1: $nops op rows adding up to the total ($sum_gb of $tot_gb GB, $sum_ms of $tot_ms ms)"
else
  bad "llama-tiny, TZ_STEP_OPS=1: op rows ${nops:-0}, $sum_gb GB and $sum_ms ms against the total $tot_gb GB, $tot_ms ms"
  tail -30 <<< "$out"
fi
out=$("$tz" bench --preset dit-tiny --dry-run 2>&1)
grep -q "^ *GEMM  *[0-9]" <<< "$out" && grep -q "^ *total " <<< "$out" && ok "dit-tiny: a step model table" ||
  { bad "dit-tiny: no step model table"; tail -5 <<< "$out"; }
finish step_model
