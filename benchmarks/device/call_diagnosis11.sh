#!/bin/bash
# Profiles of the eleventh held-out batch's misses, run after its measurement (the held-out result
# is the first run, scored before this): DTensor TP 4 + SP on shape P (-36.6 %), steps_alt.py's
# eager MoE EP 4 top-4 (-33.5 %) and steps_third.py's MoE EP 2 (-11.4 %), each with the profiler
# record (busy, NCCL and idle GPU time per rank, kernels, top host ops). 4x H100, about 2 minutes.
THIRD=h11t_moe_ep2_H ALT=h11_tp4sp_P,h11_moe_ep4_M exec bash "$(dirname "$0")/call_diagnosis10.sh"
