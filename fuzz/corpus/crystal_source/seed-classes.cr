# memprof's class-naming fixture (tests/tests/classes.rs): makes and keeps
# exactly 12,345 Widget (instance variables and no `initialize`: its `new`
# is the compiler's), 1,000 Gadget (an `initialize` of its own), 55 Holder
# (holding a struct), 77 Array(Gadget) and 1 Hash(String, Gadget), then
# prints `made` and exits. With the argument `wait` it first prints
# `ready` and waits for a line on stdin (memprof attaches meanwhile), and
# after `made` waits for stdin to close.
class Widget
  @a = 1
  @b = "x"
end

class Gadget
  def initialize(@n : Int32)
  end
end

struct Point
  def initialize(@x : Int32, @y : Int32)
  end
end

class Holder
  def initialize(@p : Point)
  end
end

# Class variables (global roots) keep everything to the end; the
# containers are made after `ready`, so `attach` sees them made.
class Keep
  class_property widgets : Array(Widget)? = nil
  class_property by_name : Hash(String, Gadget)? = nil
  class_property lists : Array(Array(Gadget))? = nil
  class_property holders : Array(Holder)? = nil
end

wait = ARGV.first? == "wait"
if wait
  puts "ready"
  STDOUT.flush
  STDIN.gets
end
widgets = Keep.widgets = Array(Widget).new
12_345.times { widgets << Widget.new }
by_name = Keep.by_name = Hash(String, Gadget).new
1_000.times { |i| by_name[i.to_s] = Gadget.new(i) }
first = by_name["0"]
lists = Keep.lists = Array(Array(Gadget)).new
77.times { lists << Array(Gadget).new(3, first) }
holders = Keep.holders = Array(Holder).new
55.times { |i| holders << Holder.new(Point.new(i, i)) }
puts "made"
STDOUT.flush
STDIN.gets_to_end if wait
