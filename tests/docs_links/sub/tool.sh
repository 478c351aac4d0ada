#!/bin/sh
# Broken, in a script's comment: ../good.md "Where a step's time goes".
# Resolves: ../good.md "results".
