from bytecomp.cli import main

main()
