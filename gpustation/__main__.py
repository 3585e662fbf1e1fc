from gpustation.cli import console

console()
