$run0 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 2.28033 85.33 0.409136 0.672984
2 4.54911 86.97 0.362021 0.357004
3 7.23381 87.75 0.339118 0.312595
4 10.4942 88.18 0.328015 0.280968
5 12.9639 88.68 0.313925 0.254696
6 15.8769 88.76 0.31097 0.231298
7 18.8064 88.95 0.309317 0.211446
8 21.4701 89.57 0.297869 0.193687
9 24.995 89.52 0.29774 0.181975
10 28.1533 89.5 0.297118 0.176375
EOD
$run1 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 2.84224 85.38 0.402389 0.611837
2 5.41676 86.65 0.365586 0.351446
3 8.32433 87.73 0.336302 0.306857
4 11.2817 87.87 0.336311 0.275935
5 13.9567 88.88 0.312844 0.245373
6 16.7723 88.96 0.308911 0.217716
7 20.2307 89.21 0.308643 0.19304
8 23.708 89.91 0.297965 0.169833
9 26.6973 89.9 0.300228 0.153741
10 29.7499 90.05 0.299258 0.145701
EOD
$run2 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 3.54563 84.78 0.41731 0.577665
2 6.5115 86.28 0.380338 0.357199
3 9.88494 87.17 0.350313 0.314869
4 13.2171 88 0.342106 0.282512
5 16.3849 88.51 0.321954 0.249334
6 19.6648 88.72 0.319068 0.22139
7 23.6427 89.25 0.314473 0.191838
8 26.6301 89.88 0.30799 0.164139
9 29.7393 89.97 0.313025 0.144276
10 33.0318 90.03 0.313355 0.133903
EOD
$run3 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 18.9171 86.62 0.378124 0.655312
2 38.2616 88.37 0.318295 0.290938
3 57.057 89.21 0.306452 0.231394
4 77.6066 89.46 0.302995 0.182133
5 95.9257 89.79 0.299755 0.143436
6 113.172 89.82 0.306342 0.109492
7 130.945 89.74 0.319003 0.0836392
8 150.125 90.1 0.31199 0.063678
9 172.684 90.05 0.317639 0.0525836
10 192.631 90.08 0.318039 0.0477312
EOD
$run4 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 20.2983 86.83 0.365917 0.575129
2 39.3802 88.59 0.311584 0.280106
3 60.2479 89.32 0.310351 0.220707
4 82.3114 89.45 0.312942 0.170922
5 103.808 89.81 0.310022 0.128564
6 123.386 89.99 0.322019 0.0909801
7 140.509 90 0.34279 0.0622979
8 158.76 90.14 0.344546 0.0402224
9 176.111 90.25 0.354295 0.0286165
10 200.001 90.23 0.355421 0.0238563
EOD
$run5 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 24.254 87.22 0.35323 0.524374
2 44.6096 88.02 0.329063 0.287134
3 65.0993 88.74 0.320996 0.227651
4 83.7938 88.6 0.351998 0.180874
5 106.69 89.48 0.337195 0.135524
6 128.419 89.94 0.359381 0.0954688
7 148.5 90.19 0.382558 0.0624472
8 169.948 90.29 0.393415 0.0354251
9 192.122 90.48 0.408786 0.0212624
10 213.887 90.39 0.412495 0.0160782
EOD
set terminal pngcairo size 1400,1000 font ',11'
set output 'grid.png'
set multiplot layout 2,2 title 'Fashion-MNIST: test accuracy and loss'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
set key bottom right
plot $run0 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.0005', $run1 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run2 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.002', $run3 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.0005', $run4 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.001', $run5 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'training time (s)'
set ylabel 'test accuracy (%)'
set key bottom right
plot $run0 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.0005', $run1 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run2 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.002', $run3 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.0005', $run4 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.001', $run5 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'epoch'
set ylabel 'test loss'
set key top right
plot $run0 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.0005', $run1 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run2 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.002', $run3 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.0005', $run4 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.001', $run5 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'training time (s)'
set ylabel 'test loss'
set key top right
plot $run0 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.0005', $run1 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run2 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.002', $run3 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.0005', $run4 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.001', $run5 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
unset multiplot
