from theinference.cli.app import main

main()
