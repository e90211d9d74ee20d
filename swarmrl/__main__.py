from swarmrl.cli import main

main()
