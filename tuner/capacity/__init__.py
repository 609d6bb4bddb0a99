"""One configuration's capacity: a load run and its verdict (steady state + SLO), and the knee search.

Shared by the search and the gate; knows nothing of the strategy."""
