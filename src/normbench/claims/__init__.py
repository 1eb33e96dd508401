"""What a claim says and how it is judged: the claims registry (conf/claims/*.yaml read into typed claims),
what each test measures on the runs, the verdict rule, the layer-skip evaluation, and the claim page
and figure. `reproduce` (one level up) plans and runs the sweeps; this package judges what they left."""
