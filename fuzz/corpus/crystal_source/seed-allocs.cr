# memprof's Crystal test fixture: `allocs CASE` runs one allocation pattern
# whose exact counts tests/tests/crystal.rs checks, and prints nothing.
#
# Each case is a method of its own, so its stacks are distinct, and keeps
# what it allocates reachable (in Kept) so the collector frees none of it.
# The tests find the lines they expect in stacks by the `# line:NAME` marks.

class Foo
  # The String makes Foo a scanned (`GC_malloc`) object: with numbers only it
  # would be `GC_malloc_atomic`. 32 bytes with the type id.
  def initialize(@flags : Int32, @id : Int64, @size : Int64, @label : String) # line:foo_initialize
  end
end

module Kept
  class_property foos : Array(Foo)? = nil
  class_property strings : Array(String)? = nil
  class_property fiber_foos : Array(Foo)? = nil
  class_property block : Pointer(UInt8) = Pointer(UInt8).null
end

FOO_COUNT       = 100_000
STRING_COUNT    =   1_000
FIBER_FOO_COUNT =   1_000

# 100,000 Foo objects in one array buffer of 800,000 bytes.
def make_foos
  foos = Array(Foo).new(FOO_COUNT) # line:foos_array
  FOO_COUNT.times do |i|
    foos << Foo.new(7, i.to_i64, 2_i64 * i, "foo") # line:foo_new
  end
  Kept.foos = foos
end

# 1,000 strings "item-0" … "item-999": 19, 20 or 21 bytes each with the header.
def build_strings
  strings = Array(String).new(STRING_COUNT)
  STRING_COUNT.times do |i|
    strings << "item-#{i}" # line:string_build
  end
  Kept.strings = strings
end

# 1,000 Foo objects allocated on a spawned fiber's stack.
def fiber_allocs
  done = Channel(Nil).new
  spawn do # line:spawn
    foos = Array(Foo).new(FIBER_FOO_COUNT)
    FIBER_FOO_COUNT.times do |i|
      foos << Foo.new(1, i.to_i64, 0_i64, "fiber") # line:fiber_foo_new
    end
    Kept.fiber_foos = foos
    done.send(nil)
  end
  done.receive
end

# A 4,096-byte block freed with GC.free, and a 2,048-byte one kept.
def free_block
  freed = Pointer(UInt8).malloc(4096) # line:freed_block
  GC.free(freed.as(Void*))
  Kept.block = Pointer(UInt8).malloc(2048) # line:kept_block
end

case ARGV[0]?
when "foos"    then make_foos
when "strings" then build_strings
when "fiber"   then fiber_allocs
when "free"    then free_block
else
  STDERR.puts "usage: allocs foos|strings|fiber|free"
  exit 2
end
