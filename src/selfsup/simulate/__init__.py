"""Theory simulators: ``byol_dynamics`` (DirectPred paper, Eqns. 11-13) and ``norm_convergence`` (embedding-norms
paper §4.1). Run them with ``selfsup simulate NAME``."""
