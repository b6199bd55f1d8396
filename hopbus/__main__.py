from hopbus.cli.entry import main

main()
