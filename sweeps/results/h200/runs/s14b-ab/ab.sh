export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/kvlab_triton_cache
timeout 230 python3 -m pytest -q -x -p no:cacheprovider -rfE tests/kernels/decode/test_gluon.py 2>&1 | tail -40 > $OUT/pytest.log
for tag in old new old new; do
  pp="$PWD"; [ "$tag" = old ] && pp="$PWD/ab_old:$PWD"
  for sh in smollm2:tw32:s4 smollm2_512:tw32:s4 gemma512:tw32:s9 gemma8k:tw32:s9 b32:tw16:s4; do
    PYTHONPATH="$pp" timeout 60 python3 benchmarks/decode_configs.py --tag "$tag" --schemes q4_0,lm2 --shape ${sh%%:*} --configs ${sh#*:} 2>&1 | grep "^cfg" | sed "s/^/${sh%%:*} /" >> $OUT/ab.txt
  done
done
cat $OUT/pytest.log | tail -25; sort -k4,4 -k2,2 -k1,1 $OUT/ab.txt | grep -v imports
