"""What the two harnesses (``bench``, ``drills``) and the tests share, below both and above the library.

```
bench/  drills/  tests/     the benchmarks, the reliability drills, the tests (nothing imports bench or drills)
   └──────┴──────┴──► harness/   results.py: the results record both harnesses write (bench/results.json)
                                 fixtures.py: the small trainer campaigns and records they all build
                          └──► pipelines_lib
```
"""
