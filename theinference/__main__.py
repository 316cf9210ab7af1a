from theinference.cli.entry import main

main()
