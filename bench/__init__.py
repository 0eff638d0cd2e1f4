"""Side-by-side benchmarks: orchard and its peers on the same work, one JSON result per bench.

    python -m bench                      # every bench, 3 repeats, into docs/benchmarks/results/
    python -m bench forest video --repeats 5
    python -m bench --smoke --out /tmp/b # tiny sizes, one repeat, never into docs/
    python -m bench --render             # docs/benchmarks.md from the results files
    python -m bench --from-runs docs/benchmarks/results/scaling_forest_paper.runs.jsonl
                                         # the results file of a bench stopped part-way (bench/journal.py)

Each bench module has SIZES ("full", "smoke", ...), ESTIMATE (how long full mode takes on an
idle 2-core machine) and measure(size, repeats) -> rows (bench/rows.py); its docstring says what
is compared and why the comparison is fair.
"""

# name -> (module, size used in full mode); smoke mode always uses the module's "smoke" size
BENCHES = {
    "overhead": ("bench.orchard_overhead", "full"),
    "singa": ("bench.singa_engine", "full"),
    "forest": ("bench.forest_vs_peers", "full"),
    "video": ("bench.video_pipeline", "full"),
    "flower": ("bench.flower_strategies", "full"),
    "flower_loader": ("bench.flower_loader", "full"),
}
# benches that need more than the development machine: run by name only
EXTRA_BENCHES = {
    "forest_mid": ("bench.forest_vs_peers", "mid"),      # 150k pixels x 1,000 offsets: issue 34's deciding shape, ~16 min
    "forest_paper": ("bench.forest_vs_peers", "paper"),  # 500k pixels x 2,000 offsets: ~17 GB RAM (LightGBM's peak), ~12 min
    "forest_beyond": ("bench.forest_vs_peers", "beyond"),  # 3.4M pixels x 2,000 offsets: the peers' matrix (25 GiB) does not fit; ~35 min
    "video_shift": ("bench.video_shift", "full"),          # worker shifting on vs off: ~14 min
    "video_cores": ("bench.video_cores", "full"),          # the decode stage vs the loops at 2, 4, 8, 16 cores: ~1 min on 2, over 6 on 16
    "flower_profile": ("bench.flower_profile", "full"),    # where the ring and ps-sync step loops go: ~6 min
    "scaling": ("bench.scaling", "full"),                  # every workload at 1, 2, 4, ... workers and on 1, 2, 4 nodes: ~25 min
    "scaling_forest": ("bench.scaling", "forest"),         # the forest alone, for a bigger machine's minutes
    "scaling_forest_few": ("bench.scaling", "forest_few"),  # the forest at 1, cores/4, all cores, one node: ~7 min on 16 cores
    "scaling_forest_paper": ("bench.scaling", "forest_paper"),  # the paper shape at cores/4 and all cores: ~8 min on 16 cores
    "forest_actors": ("bench.scaling", "forest_actors"),  # the paper shape on all cores, an actor a worker vs a quarter
    "forest_cores": ("bench.forest_cores", "full"),        # the forest's phase-2 counting in N plain processes: the machine's ceiling, ~1 min on 2
    "scaling_ps": ("bench.scaling", "ps"),                 # flower ps and singa (sync_ps) alone: ~20 min
    "ps_wire": ("bench.ps_wire", "full"),                  # a server's push+pull in pieces vs one array, 1 and 2 nodes: ~2 min
    "flower_jpeg": ("bench.flower_jpeg", "full"),          # JPEG photos counted as their PNGs, with vs without the degradations: ~16 min
    "flower_gpu": ("bench.flower_gpu", "full"),            # experiment=flower_gpu's two ends, images/s and GPU busy: a CUDA GPU, ~10 min
    "flower_gpu_ps": ("bench.flower_gpu", "ps"),           # ps vs ring at one worker on one GPU: ~6 min
    "flower_gpu_sweep": ("bench.flower_gpu", "sweep"),     # trials sharing one GPU vs one at a time: ~8 min a repeat
}
# benches that need a CUDA GPU: `python -m bench` refuses them elsewhere, in one line, before anything runs
NEEDS_CUDA = {"flower_gpu", "flower_gpu_ps", "flower_gpu_sweep"}
# Benches of which one repeat is already a result worth keeping (about an hour each on 2 cores, or a
# GPU sweep that fills most of a lent machine's 15 minutes):
# `--repeats 1` is allowed for them alone; the tables show such a figure with n=1 and no spread.
ONE_REPEAT_BENCHES = {"forest_paper", "forest_beyond", "flower_gpu_sweep"}
