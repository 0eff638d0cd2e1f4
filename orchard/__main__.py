import gc

from orchard.cli import main

try:
    main()
finally:
    # The process ends here. The interpreter's last collection, at its exit, would walk the
    # whole heap (Ray, MLflow, SQLAlchemy, torch: 1.6 s at the end of a singa smoke run on 2
    # cores) only to free what the operating system frees anyway; frozen, it walks nothing.
    gc.freeze()
