$run0 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 4.03672 85.38 0.402389 0.611837
2 7.3907 86.65 0.365586 0.351446
3 11.2696 87.73 0.336302 0.306857
4 14.0851 87.87 0.336311 0.275935
5 16.8831 88.88 0.312844 0.245373
6 19.8385 88.96 0.308911 0.217716
7 22.6962 89.21 0.308643 0.19304
8 26.5692 89.91 0.297965 0.169833
9 30.0372 89.9 0.300228 0.153741
10 33.9904 90.05 0.299258 0.145701
EOD
$run1 << EOD
# epoch train_seconds test_accuracy test_loss train_loss
0 0 11.13 2.30591 0
1 21.2938 87.22 0.35323 0.524374
2 42.1594 88.02 0.329063 0.287134
3 64.9696 88.74 0.320996 0.227651
4 87.1162 88.6 0.351998 0.180874
5 109.548 89.48 0.337195 0.135524
6 127.892 89.94 0.359381 0.0954688
7 144.795 90.19 0.382558 0.0624472
8 164.543 90.29 0.393415 0.0354251
9 183.163 90.48 0.408786 0.0212624
10 203.797 90.39 0.412495 0.0160782
EOD
set terminal pngcairo size 1400,1000 font ',11'
set output 'compare-full.png'
set multiplot layout 2,2 title 'Fashion-MNIST: test accuracy and loss'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
set key bottom right
plot $run0 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run1 using 1:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'training time (s)'
set ylabel 'test accuracy (%)'
set key bottom right
plot $run0 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run1 using 2:($1 > 0 ? $3 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'epoch'
set ylabel 'test loss'
set key top right
plot $run0 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run1 using 1:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
set xlabel 'training time (s)'
set ylabel 'test loss'
set key top right
plot $run0 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'adamw lr=0.001', $run1 using 2:($1 > 0 ? $4 : NaN) with linespoints lw 2 title 'shampoo(adam grafting, every 20) lr=0.002'
unset multiplot
