module kernelset.dev/kernelset

go 1.19
